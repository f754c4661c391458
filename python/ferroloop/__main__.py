"""``python -m ferroloop APP``: the server's command line (see ``ferroloop.server.cli``)."""

from ferroloop.server.cli import main

if __name__ == "__main__":
    main()
