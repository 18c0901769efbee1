"""A sandbox from an image without /etc/hosts (debootstrap makes none) still
resolves localhost and its own hostname, like a Docker container; a
snapshot/fork carries the file but each sandbox gets its own hostname line."""

import warren


def _hosts(sb):
    return sb.exec(["cat", "/etc/hosts"], timeout=30).stdout.decode()


def test_localhost_and_own_hostname_resolve(client, base_layer):
    with client.create(layers=[base_layer]) as sb:
        r = sb.exec("getent hosts localhost; getent hosts $(hostname); "
                    "python3 -c \"import socket; print(socket.gethostbyname('localhost'))\"", timeout=30)
        assert r.exit_code == 0, r
        lines = r.stdout.decode().splitlines()
        assert lines[0].split()[0] in ("127.0.0.1", "::1"), lines
        assert lines[1].split()[0] == "127.0.1.1", lines
        assert lines[2] == "127.0.0.1"
        host = sb.exec(["hostname"], timeout=30).stdout.decode().strip()
        assert f"127.0.1.1\t{host}\n" in _hosts(sb)
        # a process can bind and reach "localhost"
        r = sb.exec("python3 -c \"import socket; s=socket.socket(); s.bind(('localhost', 0)); s.listen(); "
                    "c=socket.create_connection(('localhost', s.getsockname()[1])); print('ok')\"", timeout=30)
        assert r.stdout == b"ok\n", r
        kids = sb.fork(1)
        try:
            kid = kids[0]
            kid_host = kid.exec(["hostname"], timeout=30).stdout.decode().strip()
            assert kid_host != host
            assert f"127.0.1.1\t{kid_host}\n" in _hosts(kid) and host not in _hosts(kid)
        finally:
            for k in kids:
                k.destroy()
            for layer in {ref for k in kids for ref in k.cached_info.layers} - {base_layer}:
                try:
                    client.layers.remove(layer)
                except warren.WarrenError:
                    pass
