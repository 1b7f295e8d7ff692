"""The one exception users see: a one-line message and an exit code."""


class CkptError(Exception):
    """A failure explained in one line; the CLI prints `ckpt: error: <msg>`."""

    def __init__(self, message, exit_code=1, reported=False):
        super().__init__(" ".join(str(message).split()))
        self.exit_code = exit_code
        self.reported = reported  # already told to the user by a native tool

    @property
    def message(self):
        return self.args[0]
