"""bench/plotlib.py — what the bench/plot-*.py scripts share: matplotlib's pyplot on the Agg backend."""
import os
import sys


def pyplot():
    """Returns matplotlib.pyplot, drawing to files (Agg). Debian's python3-matplotlib lives under the
    system interpreter, which a pyenv or venv python3 on PATH may hide: where matplotlib is missing,
    the calling script is run again under /usr/bin/python3 before this gives up."""
    try:
        import matplotlib
    except ImportError:
        if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
            os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
        sys.exit(f"{os.path.basename(sys.argv[0])}: needs matplotlib (Debian: apt-get install python3-matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
