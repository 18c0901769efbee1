"""Basic isolation facts of a container sandbox, observed from inside (no
traffic is sent anywhere)."""


def test_no_network_but_loopback(sandbox):
    r = sandbox.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", timeout=30)
    assert r.exit_code == 0 and r.stdout.split() == [b"lo"]


def test_own_pid_namespace_and_init(daemon, sandbox):
    r = sandbox.exec("cat /proc/1/comm; ls /proc | grep -c '^[0-9]'", timeout=30)
    comm, n = r.stdout.split()
    assert comm == b"warren-init"
    assert int(n) < 10  # init, sh, ls, grep ... not the host's processes
    r = sandbox.exec(f"test -e /proc/{daemon.pid}/exe && cat /proc/{daemon.pid}/comm", timeout=30)
    assert b"warrend" not in r.stdout


def test_hostname_and_user(client, base_layer):
    with client.create(layers=[base_layer], hostname="agent-box",
                       env={"GREETING": "hi"}, workdir="/tmp") as sb:
        r = sb.exec("hostname; id -u; pwd; echo $GREETING", timeout=30)
        assert r.stdout == b"agent-box\n0\n/tmp\nhi\n"
        r = sb.exec("id -u; id -g", user="1000:1001", timeout=30)
        assert r.stdout == b"1000\n1001\n"
        r = sb.exec("pwd; echo $GREETING", cwd="/", env={"GREETING": "yo"}, timeout=30)
        assert r.stdout == b"/\nyo\n"


def test_host_root_not_visible(sandbox, daemon):
    # The daemon's state dir (on the host) does not exist inside.
    r = sandbox.exec(f"ls -d {daemon.state_dir} 2>/dev/null; echo end", timeout=30)
    assert r.stdout == b"end\n"
