"""``hosts:``: several boxes behind one front door. The config's lines, what is rendered for each host (checked by the
real compose binary), how each host is reached, and the image copy's progress, all with values written out by hand.
The real thing (a second dockerd behind a real sshd) is tests/test_hosts_docker.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from kit import compose, config as cfg, hosts, imagecopy, render, resolve
from kit.errors import KitError
from tests.conftest import make_config
from tests.test_compose import COMPOSE, needs_compose

TWO = {"preset": "cpu", "model": {"dir": "/srv/models", "file": "tiny.gguf"}, "serve": {"port": 9000},
       "hosts": [{"name": "here"}, {"name": "box2", "docker": "ssh://kit@192.168.1.12"}]}


def with_hosts(*more: dict, **top) -> dict:
    return {**TWO, "hosts": [{"name": "here"}, *more], **top}


@pytest.mark.parametrize("hosts_, line", [
    ([{"name": "here"}, {"name": "here", "docker": "ssh://kit@10.0.0.2"}],
     "hosts[1].name: 'here' is named twice; give every host its own name"),
    ([{"name": "here"}, {"name": "box2", "docker": "ssh://kit@box2.lan"}],
     "hosts[1].address: the front door cannot tell where box2's engine is; write the host's IP, e.g. address: "
     "192.168.1.12"),
    ([{"name": "here"}, {"name": "box2", "docker": "ssh://box2", "address": "box2.lan"}],
     "hosts[1].address: 'box2.lan' is not an IP address; the engine publishes its port on it, so write the host's "
     "IP, e.g. 192.168.1.12"),
    ([{"name": "here"}, {"name": "box2", "docker": "http://10.0.0.2"}],
     "hosts[1].docker: 'http://10.0.0.2' is not a Docker endpoint; write ssh://user@host, tcp://host:2376, "
     "unix:///path or a Docker context name"),
    ([{"name": "Box 2"}], "hosts[0].name: 'Box 2' is not a host name kit can use; write lower-case letters, digits "
     "and '-', like box2"),
    ([{"docker": "ssh://kit@10.0.0.2"}], "hosts[0].name: Field required; see `kit init` for the expected form"),
    ([{"name": "box2", "docker": "ssh://kit@10.0.0.2"}],
     "hosts[0].docker: the first host is this machine: it runs the front door, and kit checks its model, ports and "
     "images here; list this machine first, with no docker endpoint"),
    ([{"name": "here", "hardware": {"gpus": 1}}],
     "hosts[0].hardware: the first host is this machine, whose hardware is `hardware:`; move these values to "
     "hardware:"),
    ([{"name": "here"}, {"name": "box2", "docker": "ssh://10.0.0.2", "hardware": {"gpuz": 1}}],
     "hosts[1].hardware.gpuz: unknown key; did you mean 'gpus'?"),
    ([{"name": "here"}, {"name": "box2", "docker": "ssh://10.0.0.2", "hardware": {"archs": [75]}}],
     "hosts[1].hardware.archs: every host runs the same image; list every host's arch in hardware.archs (now [70]) "
     "and drop this one"),
    ([{"name": "here"}, {"name": "box2", "docker": "ssh://10.0.0.2", "tls": "/etc/kit/tls"}],
     "hosts[1].tls: TLS material is for a tcp:// endpoint; drop tls, or write docker: tcp://HOST:2376"),
    ([{"name": "here"}, {"name": "box2", "docker": "ssh://10.0.0.2", "colour": "red"}],
     "hosts[1].colour: unknown key; valid: address, docker, hardware, name, tls"),
])
def test_bad_hosts_are_one_line_naming_the_field(hosts_, line):
    with pytest.raises(KitError) as err:
        cfg.from_dict({"hosts": hosts_})
    assert str(err.value) == line


@pytest.mark.parametrize("host, address", [
    ({"name": "b", "docker": "ssh://kit@192.168.1.12"}, "192.168.1.12"),
    ({"name": "b", "docker": "ssh://kit@192.168.1.12:2222"}, "192.168.1.12"),
    ({"name": "b", "docker": "tcp://10.1.2.3:2376"}, "10.1.2.3"),
    ({"name": "b", "docker": "ssh://kit@box2.lan", "address": "10.9.9.9"}, "10.9.9.9"),
    ({"name": "b", "docker": "ssh://kit@192.168.1.12", "address": "10.9.9.9"}, "10.9.9.9"),  # address wins
    ({"name": "b", "docker": "box2-context"}, ""),  # a context name: no address to guess
])
def test_where_the_front_door_dials_a_replica(host, address):
    assert cfg.replica_address(cfg.Host(**host)) == address


def test_each_endpoint_kind_gives_the_clis_what_docker_reads():
    ssh, tls, context, local = (hosts.Target(1, "b", "ssh://kit@10.0.0.2", "10.0.0.2", "", False),
                                hosts.Target(1, "b", "tcp://10.0.0.2:2376", "10.0.0.2", "/etc/kit/tls", False),
                                hosts.Target(1, "b", "box2", "10.0.0.2", "", False),
                                hosts.Target(0, "here", "", "", "", True))
    assert ssh.env() == {"DOCKER_HOST": "ssh://kit@10.0.0.2"}
    assert tls.env() == {"DOCKER_HOST": "tcp://10.0.0.2:2376", "DOCKER_TLS_VERIFY": "1",
                         "DOCKER_CERT_PATH": "/etc/kit/tls"}
    assert context.env() == {"DOCKER_CONTEXT": "box2"} and context.docker_context == "box2"
    assert local.env() == {} and ssh.docker_context == ""


def test_no_hosts_is_one_host_this_machine():
    (only,) = hosts.targets(make_config({}))
    assert only == hosts.Target(0, "local", "", "", "", True)
    assert hosts.replicas(make_config({})) == []


def test_a_replica_runs_the_primary_alone_with_its_own_hardware():
    config = make_config(with_hosts({"name": "box2", "docker": "ssh://kit@10.0.0.2",
                                     "hardware": {"device_ids": ["2", "3"], "gpu_model": "Tesla V100-PCIE-32GB"}},
                                    preset="dual-v100-nvlink", stack={"fallback": "llama.cpp", "front_door": True}))
    first, box2 = hosts.targets(config)
    assert (first.name, first.first, first.address, box2.name, box2.address) == ("here", True, "", "box2",
                                                                                    "10.0.0.2")
    replica = hosts.host_config(config, box2)
    assert replica.stack.fallback is None and replica.stack.front_door is False and replica.hosts == []
    assert replica.hardware.device_ids == ["2", "3"]
    assert replica.hardware.gpu_model == "Tesla V100-PCIE-32GB"
    assert replica.hardware.gpus == 2 and replica.hardware.archs == [70]  # the rest stays the stack's
    assert hosts.host_config(config, first) is config  # the first host runs the config as written


def rendered(tmp_path: Path, data: dict) -> Path:
    out = tmp_path / "out"
    render.render_stack(make_config(data), out)
    return out


def test_the_rendered_folder_has_one_compose_stack_per_host(tmp_path):
    out = rendered(tmp_path, TWO)
    replica = sorted(str(p.relative_to(out)) for p in (out / "hosts").rglob("*") if p.is_file())
    assert replica == ["hosts/box2/.env", "hosts/box2/compose.yaml", "hosts/box2/host.env"]
    assert (out / "hosts/box2/host.env").read_text() == (
        "# kit: how docker and compose reach box2; e.g. env $(grep -v '^#' host.env) docker compose ps\n"
        "DOCKER_HOST=ssh://kit@192.168.1.12\n")
    # the same API key on every host, so a client's key works whichever host answers; the same model path
    here, box2 = compose.read_env(out / ".env"), compose.read_env(out / "hosts/box2/.env")
    assert here == box2 and here["KIT_MODEL_DIR"] == "/srv/models" and here["KIT_API_KEY"].startswith("kit-")
    assert oct((out / "hosts/box2/.env").stat().st_mode & 0o777) == "0o600"
    assert hosts.read_target(out / "hosts/box2", 1) == hosts.Target(1, "box2", "ssh://kit@192.168.1.12", "", "",
                                                                    False)


def test_the_front_door_balances_over_every_host(tmp_path):
    out = rendered(tmp_path, TWO)
    conf = (out / "front-door/nginx.conf").read_text()
    upstream = conf[conf.index("    upstream engines {"):conf.index("    }\n", conf.index("upstream engines"))]
    # serve.port 9000 is the front door's; this machine's primary is published on 9001 and reached on the compose
    # network as llama-cpp:8080; box2 runs the primary alone, published on 9000 at its own address
    assert upstream.splitlines() == [
        "    upstream engines {",
        "        least_conn;",
        "        server llama-cpp:8080 max_fails=1 fail_timeout=10s;",
        "        server 192.168.1.12:9000 max_fails=1 fail_timeout=10s;  # host box2",
    ]
    assert "proxy_next_upstream error timeout http_502 http_503 http_504 non_idempotent;" in conf


def test_a_fallback_stays_the_backup_behind_every_hosts_primary(tmp_path):
    out = rendered(tmp_path, with_hosts({"name": "box2", "docker": "ssh://kit@192.168.1.12"},
                                        {"name": "box3", "docker": "tcp://192.168.1.13:2376", "tls": "/etc/kit/tls"},
                                        stack={"fallback": "llama.cpp"}))
    conf = (out / "front-door/nginx.conf").read_text()
    servers = [line.strip() for line in conf.splitlines() if line.strip().startswith("server ") and "{" not in line]
    assert servers == ["server llama-cpp:8080 max_fails=1 fail_timeout=10s;",
                       "server 192.168.1.12:9000 max_fails=1 fail_timeout=10s;  # host box2",
                       "server 192.168.1.13:9000 max_fails=1 fail_timeout=10s;  # host box3",
                       "server llama-cpp-fallback:8080 backup;"]
    assert (out / "hosts/box3/host.env").read_text().splitlines()[1:] == [
        "DOCKER_HOST=tcp://192.168.1.13:2376", "DOCKER_TLS_VERIFY=1", "DOCKER_CERT_PATH=/etc/kit/tls"]


def test_one_host_keeps_the_primary_first_front_door(tmp_path):
    out = rendered(tmp_path, {"preset": "cpu", "stack": {"fallback": "llama.cpp", "front_door": True}})
    conf = (out / "front-door/nginx.conf").read_text()
    assert "least_conn" not in conf and not (out / "hosts").exists()
    assert "server llama-cpp-fallback:8080 backup;" in conf


@needs_compose
def test_real_compose_reads_each_hosts_stack(tmp_path):
    out = rendered(tmp_path, TWO)
    models = {}
    for folder in (out, out / "hosts/box2"):
        result = subprocess.run([*COMPOSE, "-f", str(folder / "compose.yaml"), "--env-file", str(folder / ".env"),
                                 "config", "--format", "json"], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        models[folder.name] = json.loads(result.stdout)["services"]
    assert sorted(models["out"]) == ["front-door", "llama-cpp"]
    assert sorted(models["box2"]) == ["llama-cpp"]  # no front door, no fallback on a replica
    (port,) = models["box2"]["llama-cpp"]["ports"]
    assert (port["host_ip"], port["published"], port["target"]) == ("192.168.1.12", "9000", 8080)
    (port,) = models["out"]["llama-cpp"]["ports"]
    assert (port["host_ip"], port["published"]) == ("127.0.0.1", "9001")
    assert models["box2"]["llama-cpp"]["volumes"][0]["source"] == "/srv/models"


def test_kubernetes_has_no_hosts(tmp_path):
    with pytest.raises(KitError) as err:
        render.render_stack(make_config(TWO), tmp_path / "out", target="k8s")
    assert str(err.value) == ("hosts: hosts: is for compose stacks; a cluster places pods on its own nodes; drop "
                              "hosts: for --target k8s (more replicas: scale the Deployment)")
    assert not (tmp_path / "out").exists()


def test_init_shows_hosts_commented_and_they_load_when_uncommented():
    from kit import initfile

    lines = initfile.hosts_example()
    assert lines[2:4] == ["# hosts:", "#   - name: here"]
    text = "\n".join(line[2:] for line in lines[2:])
    data = yaml.safe_load(text)
    assert data["hosts"][1]["docker"] == "ssh://kit@192.168.1.12"
    config = cfg.from_dict(data)
    assert [h.name for h in config.hosts] == ["here", "box2"]


class FakeImage:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks, self.attrs = chunks, {"Size": 300 << 20}

    def save(self, chunk_size: int, named: bool):
        assert named and chunk_size == 4 << 20
        yield from self.chunks


class FakeImages:
    def __init__(self, have: dict[str, FakeImage]) -> None:
        self.have, self.loaded = have, b""

    def get(self, tag: str) -> FakeImage:
        from docker.errors import ImageNotFound

        if tag not in self.have:
            raise ImageNotFound(tag)
        return self.have[tag]

    def load(self, data) -> list:
        self.loaded = b"".join(data)
        return []


class FakeClient:
    def __init__(self, have: dict[str, FakeImage] | None = None) -> None:
        self.images = FakeImages(have or {})


def test_the_image_copy_streams_every_byte_and_reports_progress(monkeypatch):
    # 5 chunks of 32 MiB: a progress line after 64 and 128 MiB (every 64 MiB), then the total; the clock
    # advances 2 s per reading, so 160 MiB arrive at second 6 of the copy
    chunks = [bytes([i]) * (32 << 20) for i in range(5)]
    source, dest = FakeClient({"kit/llama-cpp:x-cpu": FakeImage(chunks)}), FakeClient()
    ticks = iter(range(100, 200, 2))  # a monotonic clock starts anywhere: only differences count
    monkeypatch.setattr(imagecopy.time, "monotonic", lambda: next(ticks))
    lines: list[str] = []
    sent = imagecopy.copy("kit/llama-cpp:x-cpu", source, dest, "box2", lines.append)
    assert sent == 160 << 20 and dest.images.loaded == b"".join(chunks)
    assert lines == [
        "copying kit/llama-cpp:x-cpu to box2 (300 MiB unpacked, docker save | docker load)",
        "copying kit/llama-cpp:x-cpu to box2: 64 of ~300 MiB, 32.0 MiB/s",   # 64 MiB 2 s after the start
        "copying kit/llama-cpp:x-cpu to box2: 128 of ~300 MiB, 32.0 MiB/s",  # 128 MiB after 4 s
        "copied kit/llama-cpp:x-cpu to box2: 160 MiB, 26.7 MiB/s",            # 160 MiB after 6 s: 26.67
    ]
    assert imagecopy.missing(["kit/llama-cpp:x-cpu", "kit/front-door:0.1.0"], source) == ["kit/front-door:0.1.0"]


def test_copying_an_image_not_built_here_names_the_fix():
    with pytest.raises(KitError) as err:
        imagecopy.copy("kit/llama-cpp:x-cpu", FakeClient(), FakeClient(), "box2", lambda _l: None)
    assert str(err.value) == ("images: kit/llama-cpp:x-cpu is not built on this machine, so it cannot be copied to "
                              "box2; run `kit build` first (or set build.push and push it to your registry)")


def test_status_shows_a_host_it_cannot_reach_and_the_others(monkeypatch):
    from kit import deploy

    class Container:
        name, labels = "kit-cpu-llama-cpp", {"com.docker.compose.project": "kit-cpu",
                                             "com.docker.compose.service": "llama-cpp", "io.kit.role": "primary"}
        attrs = {"Config": {"Image": "kit/llama-cpp:x-cpu"}}

    def client(target):
        if target.name == "box2":
            raise KitError("hosts[1].docker", "cannot reach the Docker daemon of box2 (ssh://kit@192.168.1.12)")
        return "here's client"

    monkeypatch.setattr(hosts, "client", client)
    monkeypatch.setattr(deploy, "containers", lambda config, c: [Container()] if c == "here's client" else [])
    monkeypatch.setattr(deploy, "health", lambda c: "healthy")
    rows = deploy.status(make_config(TWO))
    assert rows == [
        {"host": "here", "stack": "kit-cpu", "service": "llama-cpp", "container": "kit-cpu-llama-cpp",
         "image": "kit/llama-cpp:x-cpu", "state": "healthy", "role": "primary"},
        {"host": "box2", "stack": "kit-cpu", "service": "", "container": "", "image": "",
         "state": "unreachable: cannot reach the Docker daemon of box2 (ssh://kit@192.168.1.12)", "role": ""},
    ]


# ---------------------------------------------------------------- one model across hosts (llama.cpp RPC)

RPC = {"preset": "dual-v100-nvlink", "model": {"dir": "/srv/models", "file": "tiny.gguf"}, "serve": {"port": 9000},
       "stack": {"rpc_workers": ["big", "box3"]},
       "hosts": [{"name": "here"},
                 {"name": "big", "docker": "ssh://kit@10.0.0.2",
                  "hardware": {"gpus": 1, "memory_gib": 32, "device_ids": ["1"], "gpu_model": "Tesla V100-PCIE-32GB"}},
                 {"name": "box3", "docker": "ssh://kit@10.0.0.3"}]}


@pytest.mark.parametrize("change, line", [
    ({"stack": {"rpc_workers": ["box9"]}},
     "stack.rpc_workers[0]: 'box9' is not another host; list it under hosts: after this machine"),
    ({"stack": {"rpc_workers": ["here"]}},
     "stack.rpc_workers[0]: 'here' is not another host; this machine runs the primary; name the other hosts"),
    ({"stack": {"rpc_workers": ["big", "big"]}}, "stack.rpc_workers[1]: 'big' is named twice; name each worker once"),
    ({"stack": {"rpc_workers": ["big"], "primary": "vllm"}, "model": {"format": "hf", "dir": "/m", "file": "q"}},
     "stack.rpc_workers: vllm cannot use other hosts' devices; drop rpc_workers, or make the primary one of: "
     "llama.cpp"),
    ({"stack": {"rpc_workers": ["big"], "fallback": "llama.cpp"}},
     "stack.fallback: a second llama.cpp would share the primary's RPC workers, which serve one client at a time; "
     "drop the fallback, or make it another engine"),
    ({"engines": {"llama.cpp": {"split_mode": "row"}}},
     "engines.llama.cpp.split_mode: row cuts every layer over this machine's GPUs; a lent device takes whole layers; "
     "use split_mode: layer with rpc_workers"),
    ({"hosts": [{"name": "here"}, {"name": "big", "docker": "ssh://kit@10.0.0.2", "address": "0.0.0.0"}]},
     "hosts[1].address: 0.0.0.0 is every interface, not an address anyone can dial; write the host's IP "
     "(stack.rpc_listen_all publishes rpc-server on every interface)"),
])
def test_bad_rpc_workers_are_one_line_naming_the_field(change, line):
    with pytest.raises(KitError) as err:
        cfg.from_dict({**RPC, **change})
    assert str(err.value) == line


def test_the_primary_lists_every_workers_devices_after_its_own():
    argv = list(resolve.engine(make_config(RPC), "llama.cpp").argv)

    def value(flag):
        return argv[argv.index(flag) + 1]

    # big lends one 32 GB V100, box3 two 16 GB ones (the stack's hardware): RPC0 is big's, RPC1-2 box3's, numbered
    # in --rpc order; a 32 GB card next to 16 GB ones takes twice the layers: ratio 32 / 16 = 2
    assert value("--rpc") == "10.0.0.2:50052,10.0.0.3:50052"
    assert value("--device") == "CUDA0,CUDA1,RPC0,RPC1,RPC2"
    assert value("--tensor-split") == "1,1,2,1,1"
    assert value("--split-mode") == "layer" and value("--n-gpu-layers") == "all"
    assert argv.index("--rpc") < argv.index("--device")  # --rpc registers RPC0.. before --device names them


def test_a_worker_runs_rpc_server_on_its_address_with_its_gpus(tmp_path):
    out = rendered(tmp_path, RPC)
    assert not (out / "front-door").exists()  # no replica: nothing to balance
    big = yaml.safe_load((out / "hosts/big/compose.yaml").read_text())["services"]["rpc-server"]
    first = yaml.safe_load((out / "compose.yaml").read_text())["services"]["llama-cpp"]
    assert big["image"] == first["image"]  # the same image, built with GGML_RPC
    assert big["entrypoint"] == ["/app/ggml-rpc-server"]
    assert big["command"] == ["--host", "0.0.0.0", "--port", "50052"]  # its container's interfaces; published:
    assert big["ports"] == ["10.0.0.2:50052:50052"]
    # 50052 = 0xC384 (12*4096 + 3*256 + 8*16 + 4): listening on 0.0.0.0 in /proc/net/tcp, state 0A (LISTEN)
    assert big["healthcheck"]["test"] == ["CMD", "grep", "-q", "00000000:C384 00000000:0000 0A", "/proc/net/tcp"]
    assert big["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["1"]
    assert big["labels"] == {"io.kit.role": "rpc-worker", "io.kit.engine": "llama.cpp"}
    assert "volumes" not in big and "environment" not in big  # no model, no API key: the primary sends the layers
    # the whole file, written out: what compose on box "big" gets
    from kit import __version__

    text = (out / "hosts/big/compose.yaml").read_text()
    assert text.startswith(f"# Rendered by kit {__version__}: edit kit.yaml and run `kit render`, not this file.\n")
    assert yaml.safe_load(text) == {"name": "v100", "services": {"rpc-server": {
        "image": first["image"], "pull_policy": "never", "container_name": "v100-rpc-server",
        "entrypoint": ["/app/ggml-rpc-server"], "command": ["--host", "0.0.0.0", "--port", "50052"],
        "ports": ["10.0.0.2:50052:50052"], "ipc": "host",
        "healthcheck": {"test": ["CMD", "grep", "-q", "00000000:C384 00000000:0000 0A", "/proc/net/tcp"],
                        "interval": "10s", "timeout": "3s", "retries": 3, "start_period": "10s"},
        "restart": "unless-stopped",
        "logging": {"driver": "json-file", "options": {"max-size": "50m", "max-file": "3"}},
        "labels": {"io.kit.role": "rpc-worker", "io.kit.engine": "llama.cpp"},
        "ulimits": {"memlock": -1, "stack": 67108864},
        "deploy": {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "device_ids": ["1"], "capabilities": ["gpu", "compute", "utility"]}]}}}}}}
    # keys in the order written (sort_keys=False), block style
    assert text.index("image:") < text.index("entrypoint:") < text.index("healthcheck:") < text.index("deploy:")

    wide = rendered(tmp_path / "wide", {**RPC, "stack": {**RPC["stack"], "rpc_listen_all": True}})
    assert yaml.safe_load((wide / "hosts/box3/compose.yaml").read_text())["services"]["rpc-server"]["ports"] == [
        "50052:50052"]


def test_plan_puts_layers_on_lent_gpus_and_says_what_crosses_the_network(tmp_path):
    from tests.ggufmodels import write_sparse_27b

    from kit import modelinfo, plan, planreport

    write_sparse_27b(tmp_path / "q.gguf")
    config = cfg.from_dict({
        "preset": "single-v100-32g", "model": {"dir": str(tmp_path), "file": "q.gguf", "ctx": 32768},
        "engines": {"llama.cpp": {"split_mode": "layer"}}, "stack": {"rpc_workers": ["box2"]},
        "hosts": [{"name": "here"}, {"name": "box2", "docker": "ssh://kit@10.0.0.2",
                                     "hardware": {"gpus": 2, "memory_gib": 16, "device_ids": ["0", "1"]}}]})
    result = plan.make_plan(config, modelinfo.read(tmp_path / "q.gguf"))
    # 64 layers + the output layer over ratios [1, 16/32, 16/32] = shares 0.5, 0.25, 0.25: layer il goes to the
    # first device whose cumulative share exceeds il/65 -> il < 32.5 here (33 layers), il < 48.75 on RPC0 (16),
    # the last 15 and the output layer on RPC1
    assert [(g.label, len(g.layers)) for g in result.gpus] == [("0", 33), ("RPC0 (box2)", 16), ("RPC1 (box2)", 15)]
    assert [g.total for g in result.gpus] == [32 * 2**30, 16 * 2**30, 16 * 2**30]
    # crossings: local layers -> RPC0 (1), RPC0 -> RPC1 stays lent (0), the output on RPC1 comes back (1) = 2;
    # 5120-wide f32 activations = 20 KiB a token; 512 x 20 KiB x 2 = 20 MiB = 20971520 B, / 117e6 B/s = 179 ms
    assert result.network == ("network: 2 crossing(s) of this machine and lent GPUs per token, 20 KiB of activations "
                              "each; a 512-token prompt batch moves 20 MiB (179 ms at 1 Gb/s); every generated token "
                              "waits 2 round trip(s)")
    report = planreport.single(result, modelinfo.read(tmp_path / "q.gguf"), "llama.cpp")
    assert result.network in report.lines and report.rows[1][0] == "RPC0 (box2)"


def test_doctor_says_rpc_server_has_no_authentication():
    from kit import doctor

    report = doctor.Report()
    doctor.check_rpc(make_config(RPC), report)
    assert [(f.check, f.status, f.detail) for f in report.findings] == [(
        "rpc", "ok", "rpc-server has no authentication: big on 10.0.0.2:50052, box3 on 10.0.0.3:50052, reachable by "
        "anyone on that network; keep it private to these hosts")]
    wide = doctor.Report()
    doctor.check_rpc(make_config({**RPC, "stack": {**RPC["stack"], "rpc_listen_all": True}}), wide)
    assert [(f.status, f.detail) for f in wide.findings] == [(
        "warn", "rpc-server has no authentication and listens on every interface: big on 0.0.0.0:50052, box3 on "
        "0.0.0.0:50052; set stack.rpc_listen_all: false, or firewall the port to this machine")]
    none = doctor.Report()
    doctor.check_rpc(make_config(TWO), none)
    assert none.findings == []


def test_a_replica_with_less_hardware_is_planned_and_refused_before_deploy(tmp_path):
    from tests.ggufmodels import write_sparse_27b

    from kit import deploy, modelinfo, plan, planreport

    write_sparse_27b(tmp_path / "q.gguf")
    data = {"preset": "dual-v100-nvlink", "model": {"dir": str(tmp_path), "file": "q.gguf", "ctx": 16384},
            "hosts": [{"name": "here"},
                      {"name": "box2", "docker": "ssh://kit@10.0.0.2", "hardware": {"gpus": 1, "device_ids": ["0"]}},
                      {"name": "box3", "docker": "ssh://kit@10.0.0.3"}]}  # box3: the stack's hardware, not planned
    config = make_config(data)
    (target, one_gpu), = plan.on_replicas(config, modelinfo.read(tmp_path / "q.gguf"))
    # 13.2 GiB of weights and 4 x 16384 tokens x 256 KiB of f16 KV (64 layers x 8 KV heads x 128 x 2 x 2 bytes)
    # = 16 GiB of KV: on two 16 GiB cards that fits, on one it cannot
    assert target.name == "box2" and not one_gpu.fits and len(one_gpu.gpus) == 1
    assert planreport.replica_line("box2", one_gpu).startswith("host box2 (1 x 16 GiB): does not fit: ")
    with pytest.raises(KitError) as err:
        deploy.require_replicas_fit(config)
    assert str(err.value).startswith("hosts[1].hardware: the model does not fit box2 at ctx 16384; ")
    roomy = make_config({**data, "hosts": [data["hosts"][0], {**data["hosts"][1], "hardware": {
        "memory_gib": 32, "gpu_model": "Tesla V100-SXM2-32GB"}}]})
    deploy.require_replicas_fit(roomy)  # two 32 GiB cards: fits, nothing raised


@pytest.mark.parametrize("target", [
    hosts.Target(1, "box2", "ssh://kit@10.0.0.2", "10.0.0.2", "", False),
    hosts.Target(2, "box3", "tcp://10.0.0.3:2376", "10.0.0.3", "/etc/kit/tls", False),
    hosts.Target(3, "box4", "box4-context", "10.0.0.4", "", False),
])
def test_a_hosts_folder_says_how_to_reach_it_without_the_config(tmp_path, target):
    folder = tmp_path / target.name
    folder.mkdir()
    (folder / hosts.ENV_FILE).write_text(hosts.env_text(target))
    back = hosts.read_target(folder, target.index)
    # everything down and logs need: the endpoint (or context) and the TLS folder; the address is the config's
    assert (back.name, back.docker, back.tls, back.env()) == (target.name, target.docker, target.tls, target.env())


def test_a_cpu_worker_lends_one_device_whatever_gpus_it_has():
    config = make_config({**TWO, "stack": {"rpc_workers": ["box2"]},
                          "hosts": [{"name": "here"}, {"name": "box2", "docker": "ssh://kit@192.168.1.12",
                                                       "hardware": {"gpus": 2, "memory_gib": 32}}]})
    # the cpu flavor runs no GPU: box2's rpc-server serves its CPU, one device, ratio 1 whatever its cards
    assert hosts.lent_devices(config) == [hosts.LentDevice("box2", False, 32, 1.0)]

    argv = list(resolve.engine(config, "llama.cpp").argv)
    assert argv[argv.index("--device") + 1] == "RPC0" and "--tensor-split" not in argv  # one device: no split
    # the cpu flavor has no GPU of its own, but the lent device takes the layers: offloaded, one device, no split mode
    assert argv[argv.index("--n-gpu-layers") + 1] == "all" and "--split-mode" not in argv

    two = make_config({**TWO, "stack": {"rpc_workers": ["box2", "box3"]}, "hosts": [
        {"name": "here"}, {"name": "box2", "docker": "ssh://kit@192.168.1.12", "hardware": {"gpus": 2, "memory_gib": 32}},
        {"name": "box3", "docker": "ssh://kit@192.168.1.13", "hardware": {"gpus": 0, "memory_gib": 16}}]})
    argv = list(resolve.engine(two, "llama.cpp").argv)
    # two lent CPU devices (ratio 1 each) and none here: split over RPC0 and RPC1 by layer
    assert argv[argv.index("--rpc"):argv.index("--flash-attn")] == [
        "--rpc", "192.168.1.12:50052,192.168.1.13:50052", "--device", "RPC0,RPC1", "--n-gpu-layers", "all",
        "--split-mode", "layer", "--tensor-split", "1,1"]


def test_a_replica_beside_workers_serves_alone():
    config = make_config({**RPC, "hosts": [*RPC["hosts"], {"name": "box4", "docker": "ssh://kit@10.0.0.4"}]})
    (replica,) = hosts.replicas(config)
    alone = list(resolve.engine(hosts.host_config(config, replica), "llama.cpp").argv)
    assert replica.name == "box4" and "--rpc" not in alone  # the workers lend to this machine's primary only
    assert alone[alone.index("--device") + 1] == "CUDA0,CUDA1"


def test_progress_before_any_time_passed_and_without_a_size():
    assert imagecopy.progress("t", "box2", 0, 0, 0.0) == "copying t to box2: 0 MiB, 0.0 MiB/s"
    assert imagecopy.progress("t", "box2", 3 << 20, 0, 2.0, done=True) == "copied t to box2: 3 MiB, 1.5 MiB/s"


def test_a_load_the_host_refuses_is_one_line_naming_host_and_image():
    from docker.errors import APIError

    from kit.errors import CheckFailed

    class Refusing(FakeImages):
        def load(self, data):
            list(data)
            raise APIError("500 Server Error", explanation="no space left on device")

    dest = FakeClient()
    dest.images = Refusing({})
    source = FakeClient({"kit/llama-cpp:x-cpu": FakeImage([b"x"])})
    with pytest.raises(CheckFailed) as err:
        imagecopy.copy("kit/llama-cpp:x-cpu", source, dest, "box2", lambda _l: None)
    assert str(err.value) == "loading kit/llama-cpp:x-cpu on box2 failed: no space left on device"
