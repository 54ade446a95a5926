"""``python -m graphtrainer fit|validate|test|predict --config run.yaml``: see :mod:`graphtrainer.cli`."""
import sys

from .cli import main, require_jsonargparse


def _run() -> None:
    try:
        require_jsonargparse()
    except ImportError as err:  # the [cli] extra is not installed: say how to get it, no traceback
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    main()


if __name__ == "__main__":
    _run()
