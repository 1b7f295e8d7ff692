"""The `ckpt` command line."""

import datetime
import json
import os
import sys
from pathlib import Path

import click

from ckpt import __version__
from ckpt import client, completion, job_status, progress
from ckpt.config import DEFAULTS, LAUNCHER_SETTINGS, load_config
from ckpt.errors import CkptError
from ckpt.image import memory_bytes, verify_checkpoint
from ckpt.jobs import find_job, list_jobs
from ckpt.manifest import MANIFEST_NAME, needed_checkpoints, published_checkpoints
from ckpt.paths import CKPT_RE, checkpoint_name
from ckpt.write_mode import COMPRESS_MODES


class CkptGroup(click.Group):
    """Turns CkptError (and Ctrl-C in the CLI itself) into one line, no traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except CkptError as exc:
            if not exc.reported:
                click.echo(f"ckpt: error: {exc.message}", err=True)
            ctx.exit(exc.exit_code)
        except BrokenPipeError:
            # stdout went away (e.g. `ckpt images | head`): stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(141)
        except OSError as exc:
            where = f" {exc.filename}" if exc.filename else ""
            click.echo(f"ckpt: error:{where} {exc.strerror or exc}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt:
            click.echo("ckpt: interrupted", err=True)
            ctx.exit(130)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as exc:  # a bug: still one line, unless debugging
            if os.environ.get("CKPT_DEBUG"):
                raise
            click.echo(f"ckpt: error: internal error: {type(exc).__name__}: {exc}", err=True)
            ctx.exit(1)


CKPT_DIR = click.option("--ckpt-dir", type=click.Path(file_okay=False),
                        help="Where checkpoints go.")
INTERVAL = click.option("--interval", type=float, help="Seconds between periodic checkpoints.")
KEEP = click.option("--keep", metavar="K",
                    help="Keep the newest K checkpoints of the job; older ones are deleted once "
                         "a newer one is published (default: all).")
FORKED = click.option(
    "--forked/--in-place", default=None,
    help="How the job's checkpoints are written: by a copy-on-write child of each process "
         "while the job runs on, or with the job stopped until they are (default: "
         f"{'forked' if DEFAULTS['forked_write'] else 'in place'}).")
COMPRESS = click.option(
    "--compress", type=click.Choice(COMPRESS_MODES), default=None,
    help="Memory in the images: stored as it is (none), compressed with zstd, or compressed "
         f"where a sample of it shrinks (auto); default: {DEFAULTS['compress']}.")
INCREMENTAL = click.option(
    "--incremental/--no-incremental", default=None,
    help="Write only the memory that changed since the job's previous checkpoint; the "
         "rest is read from earlier checkpoints at restart "
         f"(default: {'on' if DEFAULTS['incremental'] else 'off'}).")
FULL_EVERY = click.option(
    "--full-every", metavar="K",
    help=f"With --incremental, every K-th checkpoint is a full one "
         f"(default {DEFAULTS['full_every']}).")
STAGE_DIR = click.option(
    "--stage-dir", type=click.Path(file_okay=False), metavar="DIR",
    help="Node-local directory (an SSD, /dev/shm) each host writes its images to first; "
         "they are copied to the checkpoint directory in the background, and the "
         "checkpoint is published once every copy is complete.")
COMMAND = click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
# what `ckpt launch` and `ckpt slurm run` both take; the help's defaults
# are config.py's
LAUNCH_OPTIONS = (CKPT_DIR, INTERVAL, KEEP, FORKED, COMPRESS, INCREMENTAL, FULL_EVERY,
                  STAGE_DIR, COMMAND)
LAUNCH_CONTEXT = {"ignore_unknown_options": True, "allow_interspersed_args": False}


def launch_options(command):
    """LAUNCH_OPTIONS on a command, its help listing them in this order."""
    for option in reversed(LAUNCH_OPTIONS):
        command = option(command)
    return command


def launch_config(ckpt_dir, interval, keep, forked, compress, incremental, full_every,
                  stage_dir):
    """The settings, LAUNCH_OPTIONS' flags over the file's and CKPT_*."""
    return load_config(ckpt_dir=ckpt_dir, interval=interval, keep=keep, forked_write=forked,
                       compress=compress, incremental=incremental, full_every=full_every,
                       stage_dir=stage_dir)


@click.group(cls=CkptGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ckpt")
def main():
    """Transparent checkpoint-restart for Linux jobs."""


@main.command(context_settings=LAUNCH_CONTEXT)
@click.option("--job-id", help="Job id (default: <host>-<random>).")
@launch_options
def launch(job_id, command, **settings):
    """Run COMMAND in the foreground under the checkpoint shim."""
    from ckpt.launch import launch as run_launch
    sys.exit(run_launch(list(command), launch_config(**settings), job_id))


@main.command()
@click.argument("job_id", shell_complete=completion.job_ids)
@click.option("--kill", is_flag=True, help="Kill the job once the checkpoint is written.")
@click.option("--forked/--in-place", default=None,
              help="A copy-on-write child of each process writes its image while the job "
                   "runs on (the job's default: forked), or the job stays stopped until "
                   "every image is written.")
@click.option("--compress", type=click.Choice(COMPRESS_MODES), default=None,
              help="Memory in this checkpoint's images: as it is, compressed with zstd, or "
                   "compressed where a sample shrinks (default: the job's setting).")
def checkpoint(job_id, kill, forked, compress):
    """Checkpoint a running job; prints the checkpoint directory (and, on a
    terminal, its progress on stderr)."""
    job = find_job(job_id)
    path, warnings = progress.checkpoint(
        job, lambda: client.checkpoint(job_id, kill=kill, forked=forked, compress=compress),
        lambda: client.status(job, timeout=2.0))
    for warning in warnings:
        click.echo(f"ckpt: warning: {warning}", err=True)
    click.echo(path)


@main.command()
@click.argument("job_id", shell_complete=completion.job_ids)
def kill(job_id):
    """End a running job."""
    client.kill(job_id)


@main.command()
@click.argument("image_dir", type=click.Path(), shell_complete=completion.checkpoint_dirs)
@INTERVAL
@click.option("--hosts", help="New hosts, comma-separated: the checkpoint's i-th host goes to the i-th.")
@click.option("--hostfile", type=click.File(),
              help="New hosts, one per line (# comments; `host slots=N` or `host:N`).")
@click.option("--incremental/--no-incremental", default=None,
              help="The restarted job's checkpoints are incremental, or not (default: as the "
                   "checkpoint's job took them).")
@FULL_EVERY
@STAGE_DIR
@click.option("--verify", type=click.Choice(["on", "warn", "off"]), default=None,
              help="Compare the restored processes with the checkpoint's fingerprint of them "
                   "before they run on: a difference fails the restart (on), is "
                   "a warning (warn, the default), or no comparison is made (off).")
@click.option("--lazy/--no-lazy", default=None,
              help="Resume the processes before their private memory is back: its pages "
                   "come on demand and in the background (needs userfaultfd; default: no).")
@click.option("--launcher", type=click.Choice(LAUNCHER_SETTINGS), default=None,
              help="How other hosts' ckpt-restart start: through srun inside a Slurm "
                   "allocation and ssh outside one (auto, the default), or always ssh, or "
                   "srun (on the allocation's nodes only).")
def restart(image_dir, interval, hosts, hostfile, incremental, full_every, stage_dir, verify,
            lazy, launcher):
    """Restart a job from a checkpoint (or a job directory's latest)."""
    from ckpt.restart import host_spec, restart as run_restart

    def config_for(ckpt_dir):
        return load_config(ckpt_dir=str(ckpt_dir), interval=interval, incremental=incremental,
                           full_every=full_every, stage_dir=stage_dir, verify=verify,
                           lazy=lazy, launcher=launcher)
    if hosts and hostfile:
        raise CkptError("give --hosts or --hostfile, not both", exit_code=2)
    if hosts:
        specs = [host_spec(word.split(), "--hosts") for word in hosts.split(",") if word.strip()]
    else:
        specs = _hostfile(hostfile)
    sys.exit(run_restart(image_dir, config_for, [name for name, _ in specs] or None,
                         {name: slots for name, slots in specs if slots is not None},
                         incremental=incremental))


def _hostfile(stream):
    """(host, slots or None), one host a line; `#` starts a comment."""
    from ckpt.restart import host_spec
    if stream is None:
        return []
    lines = ((number, line.split("#", 1)[0].split()) for number, line in enumerate(stream, 1))
    return [host_spec(words, f"{stream.name}, line {number}") for number, words in lines if words]


@main.command(hidden=True)
@click.option("--run", "run_command", is_flag=True, help="Run COMMAND under the agent (a restart).")
@click.option("--adopt", type=int, metavar="PID",
              help="Serve until our child PID ends (a restart's ckpt-restart, already started).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def agent(run_command, adopt, command):
    """The job's agent on a host (from the job's CKPT_* variables): started
    by ckpt-remote, or by `ckpt restart` through ssh (--adopt) or srun (--run)."""
    from ckpt.agent import run_from_environment
    if bool(run_command) != bool(command) or (adopt is not None and command):
        raise CkptError("usage: ckpt agent [--run -- COMMAND ARGS... | --adopt PID]", exit_code=2)
    sys.exit(run_from_environment(list(command), adopted=adopt))


JSON = click.option("--json", "as_json", is_flag=True,
                    help="One JSON document (format version \"v\": 1, docs/STATUS.md).")


def _echo_json(document):
    click.echo(json.dumps(document, indent=2))


@main.command()
@click.argument("job_id", required=False, shell_complete=completion.job_ids)
@JSON
def status(job_id, as_json):
    """Show a running job (or all of them): its processes and hosts, its
    last checkpoint (when, how long, how long the job was stopped, how
    big), the next one, a failure since."""
    if job_id:
        statuses = [job_status.describe(find_job(job_id), must_answer=True)]
    else:
        statuses = [job_status.describe(job) for job in list_jobs()]
    if as_json:
        _echo_json(job_status.report(statuses))
        return
    if not statuses:
        click.echo("no running jobs")
    for described in statuses:
        click.echo("\n".join(job_status.text_lines(described)))


@main.command(name="list")
@JSON
def list_command(as_json):
    """Running jobs, one a line: id, launcher pid, checkpoints taken by this
    run, the last checkpoint, the command (shell-quoted)."""
    statuses = [job_status.describe(job, timeout=2.0) for job in list_jobs()]
    if as_json:
        _echo_json(job_status.report(statuses))
        return
    for described in statuses:
        click.echo(job_status.list_line(described))


def _human_size(size):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024


def _incremental_part(manifest):
    """What an incremental checkpoint reads from earlier ones."""
    needs = sorted(needed_checkpoints(manifest))
    if not needs:
        return ""
    referred = sum(int(p.get("referred", 0)) for p in manifest["processes"])
    parent = manifest.get("parent")
    return (f", {_human_size(referred)} more in {', '.join(map(checkpoint_name, needs))}"
            + (f" (incremental on {checkpoint_name(parent)})" if parent is not None else ""))


def _describe_checkpoint(path):
    """(its line, whether it verifies), or None if it went away meanwhile
    (the job's --keep deleted it while we looked)."""
    try:
        size = sum(f.lstat().st_size for f in path.iterdir() if f.is_file())
        when = datetime.datetime.fromtimestamp(path.stat().st_mtime).strftime("%Y-%m-%d %H:%M:%S")
    except FileNotFoundError:
        return None
    memory = "memory ?"
    try:
        manifest = verify_checkpoint(path)
        verdict = "ok"
        sizes = [memory_bytes(path / str(p["image"])) for p in manifest["processes"]]
        if None not in sizes:
            mem, stored = (sum(column) for column in zip(*sizes)) if sizes else (0, 0)
            memory = f"memory {_human_size(mem)} stored as {_human_size(stored)}"
        memory += _incremental_part(manifest)
    except (CkptError, OSError) as exc:
        if not path.exists():
            return None
        verdict = f"CORRUPT: {getattr(exc, 'message', None) or exc}"
    return f"{path.name}\t{_human_size(size)}\t{when}\t{memory}\t{verdict}", verdict == "ok"


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False),
                shell_complete=completion.checkpoint_dirs)
def images(directory):
    """Checkpoints in a job or checkpoint directory, and whether they verify
    (exit status 1 if one does not)."""
    directory = Path(directory)
    if (directory / MANIFEST_NAME).exists() or CKPT_RE.match(directory.name):
        paths = [directory]
    else:
        paths = [path for _, path in published_checkpoints(directory)]
        # a ckpt-NNNN whose manifest is gone is worth showing too
        paths += [p for p in directory.iterdir() if CKPT_RE.match(p.name) and p not in paths and p.is_dir()]
    if not paths:
        raise CkptError(f"{directory}: no checkpoints")
    all_ok = True
    for path in sorted(paths):
        described = _describe_checkpoint(path)
        if described is None:
            continue
        line, ok = described
        click.echo(line)
        all_ok = all_ok and ok
    if not all_ok:
        sys.exit(1)


@main.command(name="inspect")
@click.argument("checkpoint", type=click.Path(), shell_complete=completion.checkpoint_dirs)
@click.argument("other", required=False, type=click.Path(),
                shell_complete=completion.checkpoint_dirs)
@click.option("--pid", type=int, help="That process only, in detail.")
@click.option("--diff", is_flag=True,
              help="Compare CHECKPOINT with OTHER, a later one of the same job: processes "
                   "appeared and gone, threads, memory regions, fds.")
@JSON
def inspect_command(checkpoint, other, pid, diff, as_json):
    """What a checkpoint's images hold (or a job directory's latest): the
    process tree; with --pid a process's threads, memory regions and fds;
    with --diff A B, what changed from A to B.  A corrupt or foreign image
    is refused, as a restart refuses it."""
    from ckpt.inspect import diff as diff_checkpoints, diff_lines, inspect, text_lines
    if diff != (other is not None):
        raise CkptError("usage: ckpt inspect CHECKPOINT [--pid PID] | "
                        "ckpt inspect --diff CHECKPOINT_A CHECKPOINT_B", exit_code=2)
    if diff:
        if pid is not None:
            raise CkptError("--diff compares every process: no --pid with it", exit_code=2)
        found = diff_checkpoints(checkpoint, other)
        if as_json:
            _echo_json(found)
        else:
            click.echo("\n".join(diff_lines(found)))
        return
    contents = inspect(checkpoint, pid)
    if as_json:
        _echo_json(contents)
    else:
        click.echo("\n".join(text_lines(contents, pid)))


@main.command()
@click.argument("job", shell_complete=completion.checkpoint_dirs)
@click.option("-o", "--output", type=click.Path(dir_okay=False), default="report.html",
              show_default=True, help="The HTML file to write.")
@click.option("--checkpoint", "number", type=int, metavar="N",
              help="The checkpoint whose phases, hosts and processes are shown in detail "
                   "(default: the newest).")
def report(job, output, number):
    """A self-contained HTML report of a job (its directory, or its id) from
    its event log: each phase's, host's and process's time in a checkpoint,
    sizes, durations and stopped times over the checkpoints and restarts,
    failures and warnings.  Prints the file written."""
    from ckpt.report import write_report
    write_report(job, output, number,
                 warn=lambda message: click.echo(f"ckpt: warning: {message}", err=True))
    click.echo(output)


@main.group()
def slurm():
    """Jobs under Slurm (see the README's Slurm section)."""


@slurm.command(name="run", context_settings=LAUNCH_CONTEXT)
@launch_options
def slurm_run(command, **settings):
    """The batch script's last command: launch COMMAND, or restart it from
    its latest checkpoint when Slurm requeued the job; USR1 checkpoints and
    requeues it."""
    from ckpt.slurm import run as run_slurm
    sys.exit(run_slurm(list(command), launch_config(**settings)))
