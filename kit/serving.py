"""How an engine is started: its argv from the catalog's flag table and its environment, formatted from an engine
whose settings are decided (``resolve.ResolvedEngine``).

The resolution stage calls these once per engine and keeps the result (``ResolvedEngine.argv`` and ``.env``), which
compose, the 1Panel apps and Kubernetes read, so they never disagree; ``kit tune --exec`` calls ``command`` again to
place the engine on this host instead of in its container.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kit import catalog
from kit.config import StackConfig
from kit.errors import KitError

if TYPE_CHECKING:
    from kit.resolve import ResolvedEngine

MODEL_MOUNT = "/models"
LISTEN = "0.0.0.0"  # inside a container: every interface of its own network namespace (compose publishes the port)


def flag_values(config: StackConfig, resolved: ResolvedEngine, *, model_dir: str = MODEL_MOUNT, host: str = LISTEN,
                port: int | None = None) -> dict[str, Any]:
    """Values the flag templates may use: the resolved engine settings plus stack facts. ``model_dir``, ``host`` and
    ``port`` place the engine elsewhere than in its container (``kit tune --exec`` starts the binary on this host)."""
    from kit import hosts

    name, engine = resolved.name, resolved.entry
    backend = engine.flavors[resolved.flavor].backend
    # inside the container the GPUs are numbered from 0 (compose device_ids maps them)
    local = [backend.devices.format(i=i) for i in range(config.hardware.gpus)] \
        if resolved.gpu and backend and backend.devices else []
    lent_devices = hosts.lent_devices(config) if name == config.stack.primary else []
    lent = hosts.rpc_device_names(config, lent_devices)
    ctx: dict[str, Any] = dict(resolved.settings)
    ctx.update(
        model_path=f"{model_dir}/{resolved.model_file}",
        model_name=config.model.name,
        ctx=resolved.ctx,
        slots=resolved.slots,
        host=host,
        port=port or engine.port,
        gpus=config.hardware.gpus,
        gpu=resolved.gpu,
        multi_gpu=resolved.gpu and config.hardware.gpus > 1,
        devices=local + lent,
        speculative=resolved.speculative,
        # other hosts' devices (stack.rpc_workers): layers go to them as to local GPUs
        rpc_servers=hosts.rpc_servers(config) if lent else [],
        offload=resolved.gpu or bool(lent),
        multi_device=(config.hardware.gpus if resolved.gpu else 0) + len(lent) > 1 and (resolved.gpu or bool(lent)),
    )
    if lent:
        ctx["tensor_split"] = tensor_split(ctx["tensor_split"], len(local), lent_devices)
    return ctx


def tensor_split(ratios: list[Any], local: int, lent: list[Any]) -> list[Any]:
    """One ratio per device, the local GPUs' as set (tensor_split names them), then each lent device's
    (``hosts.LentDevice.weight``: its memory over one local GPU's; a 32 GB card lent to 16 GB ones takes twice the
    layers, as llama.cpp's own default split follows free memory)."""
    own = [*ratios[:local], *[1] * (local - len(ratios[:local]))]
    return [*own, *(d.weight for d in lent)]


def _format(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(_format(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def command(config: StackConfig, resolved: ResolvedEngine, **place: Any) -> list[str]:
    """The argv after the entrypoint, one list item per token (so paths with spaces survive); ``place`` as in
    ``flag_values``."""
    name, engine = resolved.name, resolved.entry
    ctx = flag_values(config, resolved, **place)
    formatted = {k: _format(v) for k, v in ctx.items()}
    argv: list[str] = []
    for arg in engine.serve.args:
        if arg.when and not ctx.get(arg.when) or arg.unless and ctx.get(arg.unless):
            continue
        argv.append(arg.flag)
        if arg.value is not None:
            try:
                argv.append(arg.value.format(**formatted))
            except KeyError as exc:
                raise KitError(f"images/{name}.yaml", f"serve flag {arg.flag} uses unknown {exc}", "fix the catalog")
    argv.extend(str(a) for a in ctx.get("extra_args", []))
    return argv


def environment(config: StackConfig, resolved: ResolvedEngine) -> dict[str, str]:
    """The catalog's serve env, formatted with the flag values (NCCL's is added by the resolution stage)."""
    formatted = {k: _format(v) for k, v in flag_values(config, resolved).items()}
    return {key: value.format(**formatted) for key, value in resolved.entry.serve.env.items()}


def on_flavor(argv: list[str], name: str, flavor_name: str) -> list[str]:
    """``argv`` rendered for another flavor, less the flags this flavor's build cannot take (``drops_flags`` in the
    engine YAML), each with its value: how a GPU preset's command is started on a CPU build."""
    engine = catalog.get(name)
    drops = set(engine.flavors[flavor_name].drops_flags)
    takes_value = {a.flag for a in engine.serve.args if a.value is not None}
    out: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
            continue
        if token in drops:
            skip = token in takes_value
            continue
        out.append(token)
    return out
