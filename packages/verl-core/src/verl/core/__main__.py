"""``python -m verl.core``: which platform is selected, what is registered and by whom."""

import logging
import sys


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from verl.core.report import platform_report

    print(platform_report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
