"""``python -m farm``: the `farm` command (`farm.launch`)."""

from farm.launch import run

if __name__ == "__main__":
    run()
