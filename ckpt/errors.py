"""The one exception users see: a one-line message and an exit code."""


class CkptError(Exception):
    """A failure explained in one line; the CLI prints `ckpt: error: <msg>`."""

    def __init__(self, message, exit_code=1):
        super().__init__(" ".join(str(message).split()))
        self.exit_code = exit_code

    @property
    def message(self):
        return self.args[0]
