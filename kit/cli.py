"""The `kit` command: parse, call one function, print. Each verb's logic lives in its own module."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from kit import __version__
from kit.errors import CheckFailed, KitError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Render, build, verify and deploy LLM engines for V100 boxes.")
out = Console()
err = Console(stderr=True)

ConfigOpt = typer.Option(None, "--config", "-c", help="Stack config (kit.yaml); default: the dual-V100 NVLink stack.")


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
) -> None:
    """Write a commented stack config with every field defaulted."""
    from kit import config, initfile, rules

    if list_presets:
        for name, entry in config.presets().items():
            out.print(f"[bold]{name}[/]  {entry['summary']}")
        return
    text = initfile.render(preset) if preset in config.presets() else config.preset_data(preset)
    rules.validate(config.from_dict({"preset": preset}))
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
) -> None:
    """Render Dockerfiles (and compose, 1Panel apps) for the stack. Needs no GPU and no Docker."""
    from kit import render as renderer
    from kit import rules

    config = rules.load_valid(str(config_path) if config_path else None)
    written = renderer.render_stack(config, output)
    for rel in written:
        out.print(f"  {output / rel}")
    out.print(f"rendered {len(written)} files into {output}/")


def main() -> None:
    try:
        app(standalone_mode=False)
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
    except Exception as exc:  # click usage errors and friends
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise
