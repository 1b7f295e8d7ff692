"""How a job's checkpoints are written: one value from the settings
(ckpt/config.py) to the WRITE phase's words, the Python side of the shim's
`struct write_mode` (native/shim/shim.h; the words: docs/PROTOCOL.md)."""

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ckpt.wire import escape

COMPRESS_MODES = ("none", "zstd", "auto")


@dataclass(frozen=True)
class WriteMode:
    """WriteMode() is the plain write, no words: in place, uncompressed,
    full, unstaged (the user's defaults are config.py's)."""
    # a copy-on-write child of each process writes its image while the job
    # runs on; False: the job stays stopped until every image is written
    forked: bool = False
    compress: str = "none"         # page data: one of COMPRESS_MODES
    # incremental: a full checkpoint every full_every, the others hold only
    # the pages changed since the previous one; 0: every checkpoint is full
    full_every: int = 0
    # node-local directory each host writes its images to first, copied to
    # the checkpoint directory in the background; None: written there
    stage_dir: Path = None

    @property
    def incremental(self):
        return self.full_every > 0

    def overridden(self, forked=None, compress=None):
        """This mode with one checkpoint's own choices (`ckpt checkpoint
        --forked/--in-place --compress`); None keeps the job's."""
        changes = {name: value for name, value in (("forked", forked), ("compress", compress))
                   if value is not None}
        return dataclasses.replace(self, **changes)

    def before_kill(self):
        """A checkpoint that ends the job (--kill): nothing runs on for a
        forked child or a background copy to run beside, so the images go
        straight to the checkpoint directory."""
        return dataclasses.replace(self, forked=False, stage_dir=None)

    def write_words(self, staged=None, parent=None):
        """WRITE's words after the checkpoint's directory, each with its
        leading space.  staged: this checkpoint's directory under stage_dir;
        parent: the checkpoint an incremental one is taken against, or None
        for a full one."""
        words = ["fork"] if self.forked else []
        if self.compress != "none":
            words.append(self.compress)
        if self.incremental:
            words.append("incremental")
        # paths last, in this order: the shim cuts them out from the end
        if staged is not None:
            words.append("stage=" + escape(staged))
        if self.incremental and parent is not None:
            words.append("parent=" + escape(parent))
        return "".join(" " + word for word in words)
