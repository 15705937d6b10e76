"""`python -m cli ...`: the `headstart` command without its console script (the tests run it so)."""

from cli.app import main

if __name__ == "__main__":
    main()
