"""``python -m mscheduler``: the same as the ``mscheduler`` console script."""

from mscheduler.cli import main

if __name__ == "__main__":
    main()
