"""Unmodified ibverbs-utils binaries on softverbs."""
import re
import subprocess

import pytest

from conftest import free_port, wait_listening


def run(cmd, env, timeout=30):
    return subprocess.run(cmd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def devinfo(env, *args):
    p = run(["ibv_devinfo"] + list(args), env)
    assert p.returncode == 0, p.stdout
    return p.stdout


def port_lids(out):
    return [int(x) for x in re.findall(r"port_lid:\s+(\d+)", out)]


def test_binaries_resolve_to_softverbs(sv_env, softverbs_lib):
    out = subprocess.run(["ldd", "/usr/bin/ibv_rc_pingpong"], env=sv_env,
                         stdout=subprocess.PIPE, text=True).stdout
    line = [l for l in out.splitlines() if "libibverbs.so.1" in l][0]
    assert softverbs_lib in line


def test_ibv_devices(sv_env):
    p = run(["ibv_devices"], sv_env)
    assert p.returncode == 0, p.stdout
    m = re.search(r"^\s+sv0\s+([0-9a-f]{16})\s*$", p.stdout, re.M)
    assert m, p.stdout
    guid = m.group(1)
    info = devinfo(sv_env)
    node_guid = re.search(r"node_guid:\s+(\S+)", info).group(1)
    assert node_guid.replace(":", "") == guid
    # the port GID is the link-local prefix plus the port GUID
    gid = re.search(r"GID\[\s*0\]:\s+(\S+)", devinfo(sv_env, "-v")).group(1)
    assert gid.replace(":", "") == "fe80000000000000" + guid


def test_ibv_devinfo(sv_env):
    out = devinfo(sv_env, "-v")
    assert re.search(r"hca_id:\s+sv0", out)
    assert re.search(r"transport:\s+InfiniBand", out)
    assert re.search(r"state:\s+PORT_ACTIVE \(4\)", out)
    assert re.search(r"link_layer:\s+InfiniBand", out)
    assert re.search(r"active_mtu:\s+4096", out)
    assert re.search(r"phys_port_cnt:\s+1", out)
    lids = port_lids(out)
    assert len(lids) == 1 and 0 < lids[0] < 0xc000


def test_devices_from_env(sv_env):
    sv_env["SOFTVERBS_DEVICES"] = "sv0,sv1,sv7"
    out = run(["ibv_devices"], sv_env).stdout
    guids = re.findall(r"^\s+(sv\d)\s+([0-9a-f]{16})", out, re.M)
    assert [g[0] for g in guids] == ["sv0", "sv1", "sv7"]
    assert len({g[1] for g in guids}) == 3
    info = devinfo(sv_env)
    lids = port_lids(info)
    assert len(lids) == 3 and len(set(lids)) == 3, info
    assert "sv1" in devinfo(sv_env, "-d", "sv1")


def test_devices_from_yaml(sv_env, tmp_path):
    cfg = tmp_path / "sv.yaml"
    cfg.write_text("# softverbs\nseed: 7\ndevices:\n  - name: mlx_a\n  - mlx_b\n")
    sv_env["SOFTVERBS_CONFIG"] = str(cfg)
    out = run(["ibv_devices"], sv_env).stdout
    assert re.findall(r"^\s+(mlx_\w)\s", out, re.M) == ["mlx_a", "mlx_b"]


def test_lid_per_incarnation(sv_env):
    """Processes that overlap share the device's LID; once every user is
    gone, the next open is a new adapter incarnation with a new LID."""
    sv_env["SOFTVERBS_SEED"] = "1234"
    port = free_port()
    holder = subprocess.Popen(["ibv_rc_pingpong", "-p", str(port)],
                              env=sv_env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        wait_listening(port, holder)
        first = port_lids(devinfo(sv_env))
        second = port_lids(devinfo(sv_env))
        assert first == second
    finally:
        holder.kill()
        holder.wait()
    third = port_lids(devinfo(sv_env))
    fourth = port_lids(devinfo(sv_env))
    assert third != first and fourth != third


def test_seed_reproducible(sv_env, tmp_path):
    def lids(seed, d):
        env = dict(sv_env, SOFTVERBS_SEED=str(seed),
                   SOFTVERBS_DIR=str(tmp_path / d))
        return [port_lids(devinfo(env))[0] for _ in range(3)]
    a, b, c = lids(99, "a"), lids(99, "b"), lids(100, "c")
    assert a == b
    assert a != c
    assert len(set(a)) == 3
