"""Imported first by the fork server the built-in trainer's workers are forked from (the
agent's ``multiprocessing.set_forkserver_preload``): the server dies with the agent that
started it (trainer.orphans). It cannot notice the agent's end by itself: every worker holds
the write end of the pipe it watches for that, and the workers wait on the server."""

from torchjob.trainer.orphans import die_with_parent

die_with_parent()
