"""The child process of `engine.TrainProcess`: `python -m engine.train.train_child` (see train_process)."""

import os
import sys

from engine.train.train_process import child_main

if __name__ == "__main__":
    child_main()
    # end now: the thread that reads "stop" from stdin may still be blocked in that read, and an
    # orderly shutdown would wait on it (or abort on its buffer's lock)
    sys.stderr.flush()
    os._exit(0)
