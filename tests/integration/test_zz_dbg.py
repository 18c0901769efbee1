import warren, time
from desktop_helpers import SERVER, pixels, field_box, has_colour, stable_shot, wait
def test_dbg(client, base_layer):
    try:
        client.layers.get("toolset/desktop@1")
    except warren.NotFound:
        client.layers.build("toolset/desktop@1", dir="/var/cache/warren/rootfs/toolset-desktop", timeout=600)
    sb = client.create(layers=[base_layer,"toolset/desktop@1"], memory_mb=1024)
    try:
        sb.screenshot()
        sb.files.write("/root/server.pl", SERVER.encode())
        sb.exec("setsid perl /root/server.pl </dev/null >/tmp/server.log 2>&1 &", timeout=30)
        time.sleep(1)
        sb.exec("HOME=/root DISPLAY=:0 setsid dillo http://127.0.0.1:8080/ </dev/null >/tmp/dillo.log 2>&1 &", timeout=30)
        wait(lambda: has_colour(pixels(sb.screenshot().png)[2], 1024, (0xff,0xd0,0)) >= 0, 30, "page")
        t0=time.monotonic()
        r = sb.exec("until DISPLAY=:0 xdotool search --onlyvisible --class Dillo; do sleep 0.1; done", timeout=30)
        print("search", r.stdout, time.monotonic()-t0)
        shot = stable_shot(sb, interval=0.5)
        w,h,rows = pixels(shot.png)
        print("field", field_box(rows, w, (0xff,0xd0,0)))
        open("/tmp/dillo.png","wb").write(shot.png)
    finally:
        sb.destroy()
