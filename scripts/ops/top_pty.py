#!/usr/bin/env python3
"""Run a command in a pseudo-terminal of its own, between it and this process's
terminal (a tmux pane in `scripts/ops/e2e-top-hostile.sh`), and record what only the
middle can see: every byte the command writes to its terminal, its PID while it runs,
and at its end its exit status, peak memory and CPU time.

    top_pty.py OUT_PREFIX -- COMMAND [ARG...]

Writes OUT_PREFIX.raw (the command's terminal output, byte for byte, also passed on to
this terminal), OUT_PREFIX.pid (at start), OUT_PREFIX.err (the command's stderr) and,
when it ends, OUT_PREFIX.result: `status=N maxrss_kb=N cpu_s=F` (from wait4).
Keys typed here (tmux send-keys) go to the command; the window size is passed on.
"""

import fcntl
import os
import pty
import select
import sys
import termios
import tty


def main():
    prefix = sys.argv[1]
    assert sys.argv[2] == "--", "usage: top_pty.py OUT_PREFIX -- COMMAND [ARG...]"
    command = sys.argv[3:]
    stdin = sys.stdin.fileno()
    size = fcntl.ioctl(stdin, termios.TIOCGWINSZ, b"\0" * 8)
    pid, master = pty.fork()
    if pid == 0:
        fcntl.ioctl(0, termios.TIOCSWINSZ, size)
        err = os.open(prefix + ".err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(err, 2)
        os.execvp(command[0], command)
    with open(prefix + ".pid", "w") as f:
        f.write(str(pid))
    saved = termios.tcgetattr(stdin)
    tty.setraw(stdin)
    try:
        with open(prefix + ".raw", "wb") as raw:
            while True:
                ready, _, _ = select.select([master, stdin], [], [])
                if master in ready:
                    try:
                        data = os.read(master, 65536)
                    except OSError:  # EIO: the command closed its terminal
                        data = b""
                    if not data:
                        break
                    raw.write(data)
                    raw.flush()
                    os.write(sys.stdout.fileno(), data)
                if stdin in ready:
                    data = os.read(stdin, 1024)
                    if data:
                        os.write(master, data)
    finally:
        termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
    _, status, usage = os.wait4(pid, 0)
    with open(prefix + ".result.tmp", "w") as f:
        f.write(
            "status=%d maxrss_kb=%d cpu_s=%.3f\n"
            % (
                os.waitstatus_to_exitcode(status),
                usage.ru_maxrss,
                usage.ru_utime + usage.ru_stime,
            )
        )
    os.replace(prefix + ".result.tmp", prefix + ".result")


if __name__ == "__main__":
    main()
