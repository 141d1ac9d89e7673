"""Command line: arguments -> configuration -> one library call. No logic lives here.

Every user-fixable problem surfaces as :class:`xover.errors.XoverError` and is printed as one line
with a non-zero exit; Ctrl-C exits 130 after the library has stopped its children.
"""

from __future__ import annotations

import sys

import click

from xover.errors import XoverError

# The library's imports stand inside the commands, for start-up time: `xover --help` imports every command's module
# (click asks each for its help line) and the library takes about 0.5 s to import (xover.measure.study).


class _LazyGroup(click.Group):
    """Imports a subcommand's module only when that subcommand runs (keeps `xover --help` fast)."""

    def __init__(self, *args, lazy: dict[str, str] | None = None, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.lazy = lazy or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            module_name, attr = self.lazy[name].rsplit(":", 1)
            module = __import__(module_name, fromlist=[attr])
            return getattr(module, attr)  # type: ignore[no-any-return]
        return super().get_command(ctx, name)


COMMANDS = {
    "llama": "xover.cli.llama:llama",
    "synth": "xover.cli.models:synth",
    "inspect": "xover.cli.models:inspect_cmd",
    "bench": "xover.cli.bench:bench",
    "export": "xover.cli.export:export",
    "ttft": "xover.cli.ttft:ttft",
    "session": "xover.cli.session:session",
    "record": "xover.cli.record:record",
    "study": "xover.cli.study:study",
    "report": "xover.cli.report:report",
    "theory": "xover.cli.theory:theory",
    "predict": "xover.cli.theory:predict",
    "advise": "xover.cli.advise:advise",
    "cache": "xover.cli.cache:cache",
    "audit": "xover.cli.cache:audit",
}


@click.group(
    cls=_LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.version_option(package_name="xover")
def cli() -> None:
    """xover: where does llama.cpp expert offload (--n-cpu-moe) stop paying?

    Offloading MoE experts to the CPU wins decode speed or context length, but prefill then runs
    the experts from host memory. xover measures prefill and decode at depth (llama-bench),
    time-to-first-token through llama-server (every cold sample proven cold), and finds the prompt
    length past which the prefill penalty erases the decode win.

    \b
    Typical session:
      xover llama build                 # build llama-bench + llama-server (cached)
      xover synth --preset tiny-moe -o tiny.gguf
      xover inspect tiny.gguf           # what --n-cpu-moe N moves, per N
      xover bench -m model.gguf --ncmoe 12,18 --depth 1000,4000,16000,32000
      xover study                       # the whole investigation on the embedded default
    """


def _interrupted() -> None:
    """Ctrl-C / SIGTERM: one line and exit 130. A request cut off mid-connect leaves the event loop's coroutine
    unawaited; Python would warn about it at exit ("coroutine ... was never awaited"), which after an
    interruption says nothing the line does not."""
    import warnings

    warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
    click.echo("xover: interrupted; completed results are kept", err=True)
    sys.exit(130)


def main(argv: list[str] | None = None) -> None:
    from xover.llamacpp.process import ignore_signals_until_exit, install_signal_handlers, interrupted_by, stop_all

    install_signal_handlers()
    try:
        rc = cli.main(args=argv, prog_name="xover", standalone_mode=False)
        if isinstance(rc, int) and rc != 0:
            sys.exit(rc)
    except XoverError as e:
        click.echo(f"xover: error: {e}", err=True)
        sys.exit(e.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        _interrupted()
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except RuntimeError as e:  # an interrupt that reached asyncio while it was shutting down
        if not interrupted_by(e):
            raise
        _interrupted()
    finally:
        stop_all()
        if argv is None:  # the program itself (not a test calling main in-process): its work is done
            ignore_signals_until_exit()
