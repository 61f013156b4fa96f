"""Write a commented ``kit.yaml`` with every field filled in (``kit init``).

The comments are the field descriptions of the config model, so the file documents itself and cannot drift from
what the loader accepts.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel

from kit import catalog, config as cfg


def _scalar(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("\n...").strip()


GPU_SECTIONS = ("cuda", "nccl")  # read only when an engine runs on GPUs


def starting_point(preset: str, base: str = "") -> dict[str, Any]:
    """What `kit init` writes out: the preset, and ``base`` (an image made by `kit base`) as both build bases."""
    return {"preset": preset, **({"base": {"builder": base, "runtime": base}} if base else {})}


def render(preset: str, base: str = "") -> str:
    """The preset with every field; ``base`` (an image made by `kit base`) as both build bases."""
    summary = cfg.presets()[preset]["summary"] if preset in cfg.presets() else ""
    model = cfg.from_dict(starting_point(preset, base))
    gpu = model.hardware.gpus > 0
    lines = [
        f"# kit stack config - preset {preset}: {summary}",
        "# Every field is shown with its value; delete any you do not change. `kit render -c kit.yaml -o out/`.",
        f"preset: {preset}",
    ]
    for section, field in cfg.StackConfig.model_fields.items():
        if section in ("preset", "engines", "hosts"):
            continue
        sub: BaseModel = getattr(model, section)
        lines.append("")
        lines.append(f"# {field.description or ''}".rstrip() if field.description else f"# {section}")
        if section in GPU_SECTIONS and not gpu:
            lines.append(f"# {section}: not used by a stack without GPUs (hardware.gpus: 0)")
            continue
        lines.append(f"{section}:")
        for key, subfield in type(sub).model_fields.items():
            lines.append(f"  {key}: {_scalar(getattr(sub, key))}".ljust(40) + f"  # {subfield.description}")
    lines.append("")
    lines.append("# Engine settings over the catalog defaults (`kit engines --settings NAME` lists them).")
    lines.append("engines:")
    for name in model.engine_names():
        lines.append(f"  {name}:")
        for key, value in model.engine_settings(name).items():
            lines.append(f"    {key}: {_scalar(value)}")
    unused = [n for n in catalog.all_engines() if n not in model.engine_names()]
    if unused:
        lines.append(f"  # also available: {', '.join(unused)}")
    lines += hosts_example()
    return "\n".join(lines) + "\n"


def hosts_example() -> list[str]:
    """``hosts:`` commented out: one box needs none; its fields with their descriptions, for the second box."""
    lines = ["", f"# {cfg.StackConfig.model_fields['hosts'].description}", "# hosts:", "#   - name: here"]
    example = {"name": "box2", "docker": "ssh://kit@192.168.1.12", "address": "", "tls": "",
               "hardware": {"device_ids": ["0", "1"]}}
    for i, (key, field) in enumerate(cfg.Host.model_fields.items()):
        head = "#   - " if i == 0 else "#     "
        lines.append(f"{head}{key}: {_scalar(example[key])}".ljust(40) + f"  # {field.description}")
    return lines
