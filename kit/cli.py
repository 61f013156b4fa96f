"""The `kit` command: parse, call one function, print. Each verb's logic lives in its own module."""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import nullcontext as _nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from kit import __version__
from kit.errors import CheckFailed, KitError

if TYPE_CHECKING:  # imported where used: `kit --help` stays fast
    from kit.planreport import Report as PlanReport

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Render, build, verify and deploy LLM engines for V100 boxes.")
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)

ConfigOpt = typer.Option(None, "--config", "-c",
                         help="Stack config; default: ./kit.yaml if there is one, else the dual-V100 NVLink stack.")
DEFAULT_CONFIG = Path("kit.yaml")


def _config(path: Optional[Path]):
    """The validated stack config every verb starts from: -c, else ./kit.yaml, else the dual-V100 NVLink defaults."""
    from kit import rules

    if path is None and DEFAULT_CONFIG.is_file():
        path = DEFAULT_CONFIG
    return rules.load_valid(str(path) if path else None)


def _echo(line: str) -> None:
    out.print(line, markup=False, highlight=False, soft_wrap=True)


STATUS_COLORS = {"ok": "green", "warn": "yellow", "skip": "yellow", "fail": "bold red", "error": "bold red"}


def _status_table(title: str, rows: list[tuple[str, str, str]]) -> Table:
    """check / result / detail, colored by result (kit verify, kit doctor)."""
    table = Table("check", "result", "detail", title=title)
    for name, status, detail in rows:
        table.add_row(name, f"[{STATUS_COLORS[status]}]{status}[/]", detail)
    return table


def _version(value: bool) -> None:
    if value:
        out.print(f"kit {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """kit: a private LLM server on second-hand V100s."""


@app.command()
def init(
    preset: str = typer.Option("dual-v100-nvlink", "--preset", "-p", help="Starting point (see `kit init --list`)."),
    output: Path = typer.Option(Path("kit.yaml"), "--output", "-o", help="Where to write the config."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
    list_presets: bool = typer.Option(False, "--list", help="List the presets and exit."),
    base: str = typer.Option("", "--base", help="Build both stages on this image (one made by `kit base`)."),
) -> None:
    """Write a commented stack config with every field defaulted."""
    from kit import config, initfile, rules

    if list_presets:
        for name, entry in config.presets().items():
            out.print(f"[bold]{name}[/]  {entry['summary']}")
        return
    text = initfile.render(preset, base) if preset in config.presets() else config.preset_data(preset)
    rules.validate(config.from_dict(initfile.starting_point(preset, base)))
    if output.exists() and not force:
        raise KitError("--output", f"{output} exists", "pass --force to overwrite it")
    output.write_text(str(text), encoding="utf-8")
    out.print(f"wrote {output} (preset {preset})")


@app.command()
def engines(
    settings: Optional[str] = typer.Option(None, "--settings", help="Show one engine's settings and defaults."),
) -> None:
    """List engines, versions, flavors and what they support."""
    from kit import catalog

    if settings:
        engine = catalog.get(settings, field="--settings")
        table = Table("setting", "default", title=f"{engine.name} settings (engines.{engine.name}.* in kit.yaml)")
        for key, value in engine.settings.items():
            table.add_row(key, repr(value))
        out.print(table)
        return
    table = Table("engine", "version", "flavors", "recipe", "port", "dtypes", "models")
    for engine in catalog.all_engines().values():
        table.add_row(
            engine.name, engine.version, ",".join(engine.flavors), engine.recipe, str(engine.port),
            ",".join(d.replace("float", "fp") for d in engine.supports.dtypes), ",".join(engine.supports.model_formats),
        )
    out.print(table)
    for engine in catalog.all_engines().values():
        cuda = ", ".join(f"sm_{a} needs CUDA <= {v}" for a, v in engine.supports.cuda_max_for_arch.items())
        out.print(f"[bold]{engine.name}[/]: {engine.description} Entrypoint {' '.join(engine.entrypoint)}."
                  + (f" {cuda}." if cuda else ""))


@app.command()
def render(
    config_path: Optional[Path] = ConfigOpt,
    output: Path = typer.Option(Path("out"), "--output", "-o", help="Output folder (replaced as a whole)."),
    target: str = typer.Option("compose", "--target", help="compose: the compose stack and its 1Panel apps; k8s: "
                               "Kubernetes manifests (`kubectl apply -k OUTPUT/k8s`). The images' Dockerfiles either way."),
) -> None:
    """Render Dockerfiles (and compose, 1Panel apps, or Kubernetes manifests) for the stack. Needs no GPU and no Docker."""
    from kit import render as renderer

    from kit import resolve

    config = _config(config_path)
    written = renderer.render_stack(config, output, target)
    for rel in written:
        out.print(f"  {output / rel}")
    stack = resolve.stack(config)
    notes = stack.notes
    if target == "k8s":
        from kit import k8s

        notes += k8s.notes(stack)
    for note in notes:
        _echo(f"note: {note}")
    out.print(f"rendered {len(written)} files into {output}/")


@app.command()
def base(
    suite: str = typer.Option("bookworm", help="Debian suite."),
    tag: str = typer.Option("kit/base:bookworm", help="Image tag to create."),
    mirror: str = typer.Option("", help="Debian mirror URL (default: the host's apt sources)."),
    include: str = typer.Option("ca-certificates", help="Comma-separated extra packages."),
) -> None:
    """Make a Debian base image from Debian packages (mmdebstrap | docker import): no Docker Hub needed."""
    from kit import base as base_image

    with err.status(f"mmdebstrap {suite} -> {tag}"):
        image_id = base_image.make_base(suite, tag, mirror, [p for p in include.split(",") if p])
    out.print(f"{tag} {image_id}")
    out.print(f"use it: kit init --base {tag}  (or base: {{builder: {tag}, runtime: {tag}}} in kit.yaml)", markup=False)


@app.command()
def build(
    engines_: Optional[list[str]] = typer.Argument(None, metavar="[ENGINE]...", help="Default: the stack's engines."),
    config_path: Optional[Path] = ConfigOpt,
    source: Optional[Path] = typer.Option(None, "--source", help="Local engine source tree (or wheelhouse)."),
    target: str = typer.Option("runtime", "--target", help="Stop at stage (the FROM ... AS names of the rendered Dockerfile; runtime-base builds no engine code)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Build without the layer cache."),
    push: bool = typer.Option(False, "--push", help="Push after building (never without this flag)."),
    tag: Optional[str] = typer.Option(None, "--tag", help="Override the image tag."),
    report: Path = typer.Option(Path("kit-build-report.json"), "--report", help="Where to write the JSON report."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show every build output line."),
) -> None:
    """Build engine images with the Docker SDK; stream progress; write a JSON report."""
    from kit import build as builder

    config = _config(config_path)
    names = engines_ or config.engine_names()
    results = []
    for name in names:
        # on a terminal, a live line shows the current step and the elapsed time; step lines scroll above it
        with err.status(f"building {name}") if out.is_terminal else _nullcontext() as status:

            def echo(line: str, status=status) -> None:
                out.print(line, markup=False, highlight=False, soft_wrap=True)
                if status is not None:
                    status.update(f"{name}: {line[:100]}")

            result = builder.build_engine(config, name, source=source, target=target, no_cache=no_cache, push=push,
                                          tag=tag, echo=echo, verbose=verbose)
        results.append(result)
    from kit.services import FRONT_DOOR, services

    if not engines_ and target == "runtime" and any(s.role == FRONT_DOOR for s in services(config)):
        results.append(builder.build_front_door(config, no_cache=no_cache,
                                                echo=_echo))
    builder.write_report(results, report)
    table = Table("image", "id", "size", "time", "NCCL", "archs")
    for r in results:
        table.add_row(r.tag, r.image_id[7:19], f"{r.size_bytes / 2**20:.0f} MiB", f"{r.duration_s:.0f}s",
                      r.nccl_pin or "-", ",".join(map(str, r.archs)) or "cpu")
    out.print(table)
    out.print(f"report: {report}")


@app.command()
def verify(
    image: str = typer.Argument(..., help="Image to inspect, e.g. kit/llama-cpp:0c1e57098-cpu."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for machines."),
    only: Optional[list[str]] = typer.Option(None, "--check", help="Run only these checks (repeatable)."),
    serve: bool = typer.Option(False, "--serve", help="Also start the engine on the stack's model (-c) and wait "
                                                      "for its HEALTHCHECK to pass."),
    config_path: Optional[Path] = ConfigOpt,
) -> None:
    """Named checks inside a throwaway container: NCCL, entrypoint, libs, CUDA archs, runs, user, health, secrets."""
    from kit import verify as verifier

    results = verifier.verify(image, only, stack=_config(config_path) if serve else None)
    if as_json:
        print(verifier.as_json(results))
    else:
        out.print(_status_table(f"kit verify {image}", [(r.name, r.status, r.detail) for r in results]))
    failed = [r.name for r in results if r.status in ("fail", "error")]
    if failed:
        raise CheckFailed(f"{len(failed)} check(s) failed: {', '.join(failed)}")


OutOpt = typer.Option(Path("out"), "--output", "-o", help="Rendered stack folder.")


@app.command()
def deploy(
    config_path: Optional[Path] = ConfigOpt,
    output: Path = OutOpt,
    timeout: Optional[float] = typer.Option(None, help="Seconds to wait for health (default from model size)."),
) -> None:
    """Render, compose up, wait until healthy, send one chat completion, print the endpoint."""
    from kit import deploy as deployer

    config = _config(config_path)
    url = deployer.deploy(config, output, timeout, echo=_echo)
    out.print(f"[bold green]ready[/]: {url}/v1 (API key in {output / '.env'})")


@app.command()
def status(config_path: Optional[Path] = ConfigOpt) -> None:
    """The stack's containers and their health."""
    from kit import deploy as deployer

    config = None
    if config_path is None and not DEFAULT_CONFIG.is_file():
        rows = deployer.status(None)  # no config here: every stack kit deployed on this host, by its labels
    else:
        config = _config(config_path)
        rows = deployer.status(config)
    table = Table("host", "stack", "service", "role", "state", "container", "image")
    for r in rows:
        table.add_row(r["host"], r["stack"], r["service"], r["role"], r["state"], r["container"], r["image"])
    out.print(table if rows else "no containers (run `kit deploy`)")
    view = deployer.front_door_view(config) if config is not None and rows else []
    if view:
        seen = Table("upstream", "host", "backup", "state", title="the front door's view")
        for r in view:
            seen.add_row(r["upstream"], r["host"], r["backup"], r["state"])
        out.print(seen)


@app.command()
def logs(
    output: Path = OutOpt,
    config_path: Optional[Path] = ConfigOpt,
    check: bool = typer.Option(False, "--check", help="Scan for known silent failures; exit 1 with advice."),
    tail: int = typer.Option(2000, help="Lines per service."),
) -> None:
    """Engine logs; --check finds NCCL fallbacks, missing kernels, bf16, OOM, start-up failures and crash loops."""
    from kit import deploy as deployer

    text = deployer.logs(output, tail)
    if not check:
        print(text, end="")
        return
    from kit import logscan

    findings = logscan.scan(text)
    if config_path is not None or DEFAULT_CONFIG.is_file():
        findings += deployer.crash_loops(_config(config_path))
    for f in findings:
        out.print(f"[bold red]{f.name}[/]: {f.line}", soft_wrap=True)
        out.print(f"  fix: {f.advice}", soft_wrap=True)
    if findings:
        raise CheckFailed(f"{len(findings)} known problem(s) in the logs")
    out.print("logs clean: no known silent failures")


@app.command()
def down(
    output: Path = OutOpt,
    config_path: Optional[Path] = ConfigOpt,
    volumes: bool = typer.Option(False, "--volumes", help="Also delete named volumes (never the model folder)."),
) -> None:
    """Stop and remove the stack's containers. The model folder is never touched."""
    from kit import deploy as deployer

    config = _config(config_path) if config_path is not None or DEFAULT_CONFIG.is_file() else None
    deployer.down(output, volumes, config)
    out.print("stack down" + (" (volumes removed)" if volumes else "; volumes and models kept"))


model_app = typer.Typer(no_args_is_help=True, help="Models on a hub: plan every quant before downloading, then get one.")
app.add_typer(model_app, name="model")


def _hub(config, source: Optional[str]):
    from kit import hub

    text = source or config.model.source
    if not text:
        raise KitError("model.source", "no model source", "pass hf:ORG/REPO or set model.source in kit.yaml")
    return hub.connect(hub.parse_source(text, "SOURCE" if source else "model.source"), config.mirrors.hf_endpoint,
                       config.mirrors.modelscope_endpoint)


def _remote_info(config, source: str, file: Optional[str]):
    """A hub file's ModelInfo from its header (every part's, for a split GGUF)."""
    from kit import ggufheader, hub, modelchoice

    repo = _hub(config, source)
    models = hub.gguf_models(repo.files())
    if not file:
        raise KitError("--file", f"name one of {repo.source}'s GGUF files",
                       f"use one of {', '.join(m.name for m in models) or '(none)'} (kit model list plans them all)")
    model = hub.model_with_file(models, file, repo.source)
    try:
        return modelchoice.remote_info(repo, model)[0]
    except ggufheader.GGUFError as exc:
        raise KitError("--file", f"{model.name} is not a GGUF header kit can read ({exc})",
                       "plan another file (kit model list)") from None


@model_app.command("list")
def model_list(
    source: Optional[str] = typer.Argument(None, metavar="[SOURCE]", help="hf:ORG/REPO[@REV] (default: model.source)."),
    config_path: Optional[Path] = ConfigOpt,
) -> None:
    """Every GGUF in the repo, planned on this stack's GPUs from its header alone (never the weights)."""
    from kit import hub, modelchoice

    config = _config(config_path)
    repo = _hub(config, source)
    files = repo.files()
    models = hub.gguf_models(files)
    config_json = next((f for f in files if f.path == "config.json"), None)
    if not models and config_json is not None:  # a Hugging Face checkpoint: what the stack's engines make of it
        import json as jsonlib

        hf_config = jsonlib.loads(repo.open(config_json).read())
        verdicts = modelchoice.hf_verdicts(config, hf_config)
        weights = sum(f.size for f in files if f.path.endswith(".safetensors"))
        fits = False
        for v in verdicts:
            print(f"{'ok' if v.ok else 'no'}: {v.text}")
            if v.ok and weights:
                p = modelchoice.plan_hf(config, v.engine, hf_config, weights, str(repo.source))
                fits = fits or p.fits
                print(f"  {v.engine}: {weights / 2**30:.2f} GiB of weights; {p.serves}: "
                      + ("fits" if p.fits else f"does not fit ({p.fix})"))
        if not any(v.ok for v in verdicts):
            raise CheckFailed(f"no engine of this stack can serve {repo.source} on these GPUs")
        if weights and not fits:
            raise CheckFailed(f"{repo.source} does not fit this stack's GPUs")
        return
    if not models:
        raise KitError("SOURCE", f"{repo.source} has no .gguf files",
                       "pick a GGUF repo (llama.cpp serves GGUF), or convert the model with llama.cpp's tools")
    choices, fetched = [], 0
    for model in models:
        choice, read = modelchoice.plan_remote(config, repo, model)
        choices.append(choice)
        fetched += read
    best = modelchoice.recommend(choices)
    gib = 2**30
    table = Table("file", "parts", "quant", "GiB", "fits", "largest ctx",
                  title=f"{repo.source} for {config.serve.concurrency} requests at ctx {config.model.ctx} on "
                        f"{config.hardware.gpus} x {config.hardware.memory_gib:g} GiB")
    for c in choices:
        mark = " *" if c is best else ""
        fits = c.problem or ("[green]yes[/]" if c.fits else "[bold red]no[/]")
        table.add_row(c.model.name + mark, str(len(c.model.parts)), c.quant, f"{c.model.size / gib:.2f}", fits,
                      str(c.plan.max_ctx) if c.plan else "-")
    out.print(table)
    total = sum(m.size for m in models)
    print(f"read {fetched / 2**20:.1f} MiB of headers for {total / gib:.1f} GiB of files")
    if best is None:
        raise CheckFailed("no file fits this stack: serve fewer requests at once, shorten model.ctx, or add a GPU")
    print(f"recommended: {best.model.name} (the largest that fits); get it with: kit model pull "
          f"{repo.source} --file {best.model.name}")


@model_app.command("pull")
def model_pull(
    source: Optional[str] = typer.Argument(None, metavar="[SOURCE]", help="hf:ORG/REPO[@REV] (default: model.source)."),
    config_path: Optional[Path] = ConfigOpt,
    file: Optional[str] = typer.Option(None, "--file", help="The GGUF to get (any part of a split one); default: "
                                                            "the recommended one (kit model list)."),
) -> None:
    """Download into model.dir: resumable, every part of a split GGUF, sha256 checked; writes model.file back."""
    from kit import configedit, hub, modelchoice

    config = _config(config_path)
    repo = _hub(config, source)
    models = hub.gguf_models(repo.files())
    if file:
        model = hub.model_with_file(models, file, repo.source)
    else:
        choices = [modelchoice.plan_remote(config, repo, m)[0] for m in models]
        best = modelchoice.recommend(choices)
        if best is None:
            raise KitError("--file", f"no file of {repo.source} fits this stack",
                           "pass --file to take one anyway, or see kit model list")
        model = best.model
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    model_dir = Path(config.model.dir).expanduser()
    with Progress("{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                  console=out, transient=True) as bar:
        task = bar.add_task(model.name, total=model.size)
        path = hub.pull(repo, model, model_dir, echo=bar.console.print,
                        progress=lambda n: bar.advance(task, n))
    print(f"model ready: {path}")
    target = config_path or (DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None)
    if target is not None:
        configedit.set_field(Path(target), "model", "file", model.name)
        if source:  # the next pull, plan or deploy finds it again
            configedit.set_field(Path(target), "model", "source", str(repo.source))
        print(f"{target}: model.file = {model.name}" + (f", model.source = {repo.source}" if source else ""))
    else:
        print(f"set model.file: {model.name} in your kit.yaml")


panel_app = typer.Typer(no_args_is_help=True, help="1Panel: export local apps, check them, install through the API.")
app.add_typer(panel_app, name="panel")


@panel_app.command("export")
def panel_export(
    config_path: Optional[Path] = ConfigOpt,
    output: Path = typer.Option(Path("appstore"), "--output", "-o", help="Folder of local apps (replaced whole)."),
    engine: Optional[list[str]] = typer.Option(None, "--engine", help="Only these engines (default: all)."),
) -> None:
    """Write one 1Panel local app per engine, checked against the validator's rules."""
    from kit import render as renderer
    from kit import resolve
    from kit.panel import check, export

    config = _config(config_path)
    names = engine or export.runnable_apps(config)
    files = export.export_files(resolve.stack(config, names), names)
    renderer.write_tree(output, files)
    problems = check.check_store(output)
    for p in problems:
        out.print(f"{p.level}: {p.where}: {p.what}", markup=False, soft_wrap=True)
    if any(p.level == "error" for p in problems):
        raise CheckFailed("the exported apps break 1Panel's rules")
    apps = sorted({rel.split("/")[0] for rel in files})
    out.print(f"exported {len(apps)} apps into {output}/: {', '.join(apps)}")


@panel_app.command("check")
def panel_check(
    folder: Path = typer.Argument(..., help="A folder of 1Panel apps (appstore/, the store's apps/) or one app."),
    lenient: bool = typer.Option(False, "--lenient", help="Validator-only rules as warnings (for official apps)."),
) -> None:
    """Apply the official validator's and the local-app loader's rules to a folder of apps."""
    from kit.panel import check

    problems = check.check_store(folder, strict=not lenient)
    for p in problems:
        out.print(f"{p.level}: {p.where}: {p.what}", markup=False, soft_wrap=True)
    errors = [p for p in problems if p.level == "error"]
    if errors:
        raise CheckFailed(f"{len(errors)} error(s)")
    out.print(f"ok: {len(problems)} warning(s)")


@panel_app.command("install")
def panel_install(
    url: str = typer.Option(..., "--url", help="1Panel address, e.g. http://10.0.0.5:10086"),
    api_key: str = typer.Option(..., "--api-key", envvar="KIT_1PANEL_API_KEY", help="Panel > Settings > API key."),
    app_name: str = typer.Option("llama-cpp-v100", "--app", help="App key to install."),
    name: Optional[str] = typer.Option(None, "--name", help="Install name (default: the app key)."),
    store: Path = typer.Option(Path("appstore"), "--store", help="Folder with the exported apps."),
    local_dir: Optional[Path] = typer.Option(None, "--local-dir",
                                             help="Copy into this local-apps folder instead of uploading "
                                                  "(/opt/1panel/resource/apps/local on the panel host)."),
    param: Optional[list[str]] = typer.Option(None, "--param", help="KEY=VALUE form values (repeatable)."),
    allow_port: bool = typer.Option(False, "--allow-port", help="Open the port on all interfaces."),
    timeout: float = typer.Option(900, help="Seconds to wait for Running."),
    api_version: str = typer.Option("v2", "--api", help="v2 (1Panel 2.x) or v1."),
) -> None:
    """Copy or upload the app, sync local apps, install it with params, poll until Running."""
    from kit.panel import api

    params = dict(p.split("=", 1) for p in (param or []))
    client = api.PanelClient(url, api_key, api_version)
    result = api.install(client, store / app_name, name or app_name, params, local_dir=local_dir,
                         allow_port=allow_port, timeout_s=timeout,
                         echo=_echo)
    out.print(f"[bold green]{result['status']}[/]: {result.get('name')} (port {result.get('httpPort', '?')})")


@app.command()
def plan(
    model_file: Optional[str] = typer.Argument(None, metavar="[MODEL]", help="GGUF file or HF folder (default: model.dir/model.file)."),
    config_path: Optional[Path] = ConfigOpt,
    engine: Optional[str] = typer.Option(None, "--engine", help="Plan for this engine (default: stack.primary)."),
    ctx: Optional[int] = typer.Option(None, "--ctx", help="Context to plan (default: model.ctx)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    stack: bool = typer.Option(False, "--stack", help="Primary and fallback together on the same GPUs."),
    file: Optional[str] = typer.Option(None, "--file", help="With MODEL = hf:ORG/REPO: the GGUF in that repo, planned "
                                                            "from its header (HTTP ranges, never the weights)."),
) -> None:
    """Will it fit? Per-GPU weights, KV cache, compute and overhead; the largest context; the cheapest fix."""
    import json as jsonlib

    from kit import plan as planner, planreport

    config = _config(config_path)
    if stack:
        models = {n: planner.read_model(config, n, None) for n in config.engine_names()}
        together = planner.plan_stack(config, models)
        if as_json:
            print(jsonlib.dumps({"fits": together.fits, "plans": [p.as_dict() for p in together.plans]}, indent=2))
        else:
            _print_plan(planreport.stack(together))
        if not together.fits:
            raise CheckFailed(f"the stack does not fit together: {together.fix(config)}")
        return
    name = engine or config.stack.primary
    if model_file and model_file.startswith(("hf:", "modelscope:")):
        info = _remote_info(config, model_file, file)
    else:
        info = planner.read_model(config, name, model_file)
    result = planner.make_plan(config, info, name, ctx)
    replicas = planner.on_replicas(config, info, ctx) if name == config.stack.primary and not model_file else []
    if as_json:
        print(jsonlib.dumps({**result.as_dict(), "hosts": {t.name: p.as_dict() for t, p in replicas}}
                            if replicas else result.as_dict(), indent=2))
    else:
        _print_plan(planreport.single(result, info, name))
        for target, on_host in replicas:
            out.print(planreport.replica_line(target.name, on_host), markup=False)
    if not result.fits:
        raise CheckFailed(f"does not fit at ctx {result.ctx}: {result.fix}")
    short = [t.name for t, p in replicas if not p.fits]
    if short:
        raise CheckFailed(f"does not fit on {', '.join(short)}: the fix is on its line above (or drop that host's "
                          "replica)")


def _print_plan(report: PlanReport) -> None:
    """A plan report as a table (the fits column in colour), then its lines; a CPU stack has no GPU rows."""
    if report.rows:
        table = Table(*report.header, title=report.title)
        for row in report.rows:
            table.add_row(*row[:-1], "[green]yes[/]" if row[-1] == "yes" else "[bold red]no[/]")
        out.print(table)
    else:
        _echo(report.title)
    for line in report.lines:
        out.print(line, markup=False)
    for warning in report.warnings:
        _echo(f"warning: {warning}")


@app.command()
def doctor(
    config_path: Optional[Path] = ConfigOpt,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Is this host right? Driver, GPUs, links, temperatures, Docker GPU runtime, disk; and a running stack's NCCL."""
    import json as jsonlib

    from kit import config as cfg
    from kit import doctor as doc

    config = cfg.load(str(config_path) if config_path else None)
    report = doc.run(config)
    if as_json:
        print(jsonlib.dumps({"exit_code": report.exit_code, "checks": report.as_dicts()}, indent=2))
    else:
        out.print(_status_table("kit doctor", [(f.check, f.status, f.detail) for f in report.findings]))
        if report.no_driver:
            out.print("[bold]no NVIDIA driver here[/]: this machine cannot run the GPU stack (exit code 3)")
    raise typer.Exit(report.exit_code)


@app.command()
def bench(
    config_path: Optional[Path] = ConfigOpt,
    output: Path = OutOpt,
    url: Optional[str] = typer.Option(None, "--url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080; "
                                                          "default: the deployed stack's (front door or primary)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="KIT_API_KEY",
                                          help="Bearer key (KIT_API_KEY); default: the stack's, from OUTPUT/.env."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name (default: model.name of the stack, else the "
                                                              "first /v1/models entry)."),
    scenarios: str = typer.Option("short,medium,long", "--scenarios", help="Comma-separated scenarios."),
    concurrency: str = typer.Option("1,4", "--concurrency", help="Comma-separated concurrency levels."),
    requests_per: Optional[int] = typer.Option(None, "--requests", help="Requests per scenario and level."),
    warmup: int = typer.Option(1, "--warmup", help="Unrecorded warm-up requests per scenario."),
    compare: Optional[list[str]] = typer.Option(None, "--compare", help="Another endpoint to measure side by side."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write every raw sample here."),
    plot_out: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of tok/s by scenario and concurrency."),
    model_bytes: Optional[float] = typer.Option(None, "--model-bytes", help="Weights read per token, for the "
                                                "roofline (default: from kit plan's split of the stack's model)."),
    model_file: Optional[Path] = typer.Option(None, "--model-file", help="GGUF/HF model, for the roofline."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU name in images/gpus.yaml (bandwidth); default: "
                                                          "hardware.gpu_model."),
    parallel_gpus: int = typer.Option(1, "--parallel-gpus", help="GPUs reading weights at once (tensor parallel), "
                                                                 "with --model-bytes / --model-file."),
    timeout: float = typer.Option(300, "--timeout", help="Seconds per request."),
) -> None:
    """The seeds' speed table: short/medium/long decode tok/s and total tok/s under concurrency."""
    from kit import bench as bencher, benchreport, roofline

    stack = None
    if url is None or config_path is not None or DEFAULT_CONFIG.is_file():
        stack = _config(config_path)
    if url is None:
        from kit import deploy as deployer
        from kit.services import endpoint

        url = endpoint(stack)
        api_key = api_key or deployer.api_key(output)
        model = model or stack.model.name
    levels = [int(c) for c in concurrency.split(",") if c.strip()]
    names = [s.strip() for s in scenarios.split(",") if s.strip()]
    runs = []
    stop = threading.Event()

    def on_ctrl_c(signum: int, frame: Any) -> None:  # the first Ctrl-C stops the run; a second one quits
        if stop.is_set():
            signal.default_int_handler(signum, frame)
        stop.set()

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        for target in [url, *(compare or [])]:
            out.print(f"[bold]{target}[/]")
            run = bencher.run(target, api_key=api_key, model=model, names=names, concurrency=levels,
                              requests_per=requests_per, warmup=warmup, timeout_s=timeout, stop=stop,
                              echo=lambda line: out.print("  " + line, markup=False))
            runs.append(run)
            if run.interrupted:
                out.print("[yellow]interrupted: showing what was measured[/]")
                break
    finally:
        signal.signal(signal.SIGINT, previous)
    table = Table("scenario", *[r.url for r in runs], title="decode speed (seed table layout)")
    for row in benchreport.table_rows(runs):
        table.add_row(*row)
    out.print(table)
    for run in runs:
        detail = Table("scenario", "conc", "TTFT med/p90/p99 ms", "TPOT med ms", "ITL med/p99 ms", "E2EL med s",
                       "tok/s/req", "total tok/s", "req/s", "failed", "tokens", "prompt tok",
                       title=f"{run.url} ({run.model})")
        for r in run.results:
            ms = lambda d, k: f"{d.get(k, 0) * 1000:.0f}"  # noqa: E731
            detail.add_row(r.scenario, str(r.concurrency), f"{ms(r.ttft, 'median')}/{ms(r.ttft, 'p90')}/{ms(r.ttft, 'p99')}",
                           f"{r.tpot.get('median', 0) * 1000:.1f}", f"{ms(r.itl, 'median')}/{ms(r.itl, 'p99')}",
                           f"{r.e2el.get('median', 0):.2f}", f"{r.decode_tps.get('median', 0):.1f}",
                           f"{r.output_tps:.1f}", f"{r.req_per_s:.2f}", str(r.failures), r.tokens_from,
                           "-" if r.prompt_processed is None else f"{r.prompt_processed:.0f}")
        out.print(detail)
        for r in run.results:
            for e in r.errors:
                out.print(f"  [red]{r.scenario} x{r.concurrency}[/]: {e}", markup=True)
    limit, note = roofline.roofline_for(stack, model_bytes, model_file, gpu, parallel_gpus)
    if note:
        out.print(note)
    for run in runs:
        single = [r.decode_tps.get("median", 0) for r in run.results if r.concurrency == 1 and r.decode_tps]
        if limit and single:
            out.print(f"roofline {run.url}: {limit.line(max(single))}", markup=False, soft_wrap=True)
    if json_out:
        json_out.write_text(benchreport.to_json(runs), encoding="utf-8")
        out.print(f"raw samples: {json_out}")
    if plot_out:
        benchreport.plot(runs, plot_out)
        out.print(f"plot: {plot_out}")
    if any(r.failures for run in runs for r in run.results):
        raise CheckFailed("some requests failed (counted above)")


@app.command()
def tune(
    config_path: Optional[Path] = ConfigOpt,
    output: Path = OutOpt,
    engine: Optional[str] = typer.Option(None, "--engine", help="The engine to tune (default: stack.primary)."),
    objective: str = typer.Option("decode", "--objective", help="decode | throughput | ttft (images/tune.yaml)."),
    budget: str = typer.Option("30m", "--budget", help="Time for the search, e.g. 30m, 90s, 1h30m."),
    space: Optional[Path] = typer.Option(None, "--space", help="A search space file (space: setting: list of values) "
                                                               "instead of the engine's own (tune: in its YAML)."),
    write: bool = typer.Option(False, "--write", help="Put the winner into kit.yaml, with the measurement as a comment."),
    exec_binary: Optional[Path] = typer.Option(None, "--exec", help="Start this engine binary on this host (no "
                                                                     "Docker) instead of the compose stack."),
    port: int = typer.Option(18080, "--port", help="With --exec: the port the engine listens on (127.0.0.1)."),
    users: Optional[int] = typer.Option(None, "--users", help="Requests at once (default: the objective's)."),
    requests_n: Optional[int] = typer.Option(None, "--requests", help="Requests per measurement."),
    journal: Optional[Path] = typer.Option(None, "--journal", help="Trials as JSON lines; an interrupted tune "
                                                                   "resumes from it (default: ./tune-ENGINE.jsonl; not "
                                                                   "in OUTPUT, which every render replaces whole)."),
    fresh: bool = typer.Option(False, "--fresh", help="Start over: forget the journal's trials."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds for the engine to turn healthy."),
    plot_out: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of the objective per trial."),
) -> None:
    """Search the serve settings for the fastest on this box, measured with kit bench's client; --write keeps them."""
    import yaml

    from kit import catalog, tune as tuner
    from kit.tunerun import ComposeRunner, ExecRunner

    if config_path is None and DEFAULT_CONFIG.is_file():
        config_path = DEFAULT_CONFIG
    config = _config(config_path)
    raw = yaml.safe_load(config_path.read_text(encoding="utf-8")) if config_path else {}
    if write and config_path is None:
        raise KitError("--write", "there is no kit.yaml to write the winner to", "pass -c kit.yaml (`kit init` writes one)")
    name = engine or config.stack.primary
    slug = catalog.get(name, field="--engine").slug
    seconds = tuner.budget_seconds(budget)
    tuner.objective(objective)
    if exec_binary is not None:
        runner = ExecRunner(exec_binary, name, port, Path(f"tune-{slug}.log"), timeout or 600)
    else:
        runner = ComposeRunner(output, name, timeout, _echo)
    result = tuner.run(raw, runner, engine=name, objective_name=objective, budget_s=seconds,
                       space_path=space, users=users, requests_n=requests_n,
                       journal_path=journal or Path(f"tune-{slug}.jsonl"), fresh=fresh, echo=_echo)
    table = Table("trial", "settings (from the start)", objective, "limits", "decode tok/s (% roofline)", "why",
                  title=f"kit tune {name}: {result.spec['summary']}")
    for row in tuner.rows(result):
        table.add_row(*row)
    out.print(table)
    for line in tuner.summary(result):
        _echo(line)
    if plot_out:
        tuner.plot(result, plot_out)
        _echo(f"plot: {plot_out}")
    changed = tuner.changes(result)
    if write and changed:
        for line in tuner.write(config_path, result):
            _echo(f"wrote {config_path}: {line}")
    elif changed:
        now = "the stack now runs the best settings; " if runner.stays else ""
        _echo(f"{now}kit.yaml keeps them only with --write ({', '.join(f'{k}: {v}' for k, v in changed.items())})")
    elif result.result.best is not None:
        _echo("the starting settings were the best: kit.yaml is left as it is")


def main() -> None:
    try:
        code = app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except KitError as exc:
        err.print(f"error: {exc.line()}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except CheckFailed as exc:
        err.print(f"failed: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err.print("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # click usage errors (typer vendors click, so match by shape)
        if hasattr(exc, "show") and isinstance(getattr(exc, "exit_code", None), int):
            exc.show()
            sys.exit(exc.exit_code)
        raise
