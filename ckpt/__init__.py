"""ckpt: transparent checkpoint-restart for Linux jobs (Python half).

Modules, one concept each:
  cli          the `ckpt` command line (click); errors become one line
  config       settings: YAML file < CKPT_* environment < flags
  errors       CkptError, the one exception users see
  native       where native/ (shim, ckpt-restart, headers) lives
  headers      the C headers read with cffi (phases, image header)
  wire         line encoding of the coordinator protocol
  jobs         per-user registry of running jobs (state directory)
  barrier      one PHASE to every process, then all answers
  checkpoint   one checkpoint: four barriers, manifest, atomic publish
  coordinator  the per-job asyncio server: processes, name service, clients
  session      what launch and restart share: coordinator, children, signals
  launch       `ckpt launch`: preflight and run under the shim
  restart      `ckpt restart`: verify, then ckpt-restart per image
  manifest     manifest.yaml, checkpoint numbering, publish, `latest`
  image        image header and checksum verification
  client       the CLI's side of the coordinator socket
"""

# The engine version recorded in every manifest; restart refuses images
# written by another version.  Keep it here and nowhere else.
__version__ = "0.1.0"
ENGINE_VERSION = __version__
