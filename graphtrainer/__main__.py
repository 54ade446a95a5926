"""``python -m graphtrainer fit|validate|test|predict --config run.yaml``: see :mod:`graphtrainer.cli`."""
import sys

from .cli import main, require_jsonargparse


def _run() -> None:
    try:
        require_jsonargparse()
    except ImportError as err:  # the [cli] extra is not installed: say how to get it, no traceback
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        main()
    except KeyboardInterrupt:  # the ranks are ended by then (the launcher's own handling): no traceback
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    _run()
