"""User errors: the CLI turns these into one line on stderr and exit code 2."""


class DimrError(Exception):
    """A problem with what the user asked for (bad pair, budget, file, URL...).

    The message is one sentence naming the problem and what to do about it.
    Programming errors must not use this type: they should still raise with a traceback.
    """
