"""The agent's /etc/passwd and /etc/group (supervisor/boundary/forkimage/rootfs.py rule 6)."""

from __future__ import annotations

from supervisor.boundary.forkimage.rootfs import account_lines

HOST_PASSWD = "".join(
    f"{line}\n"
    for line in (
        "root:x:0:0:root:/root:/bin/bash",
        "sandbox:x:4242:4242::/home/sandbox:/bin/sh",
        "alice:x:1000:1000::/a:/bin/sh",
    )
)
HOST_GROUP = "root:x:0:\nsandbox:x:4242:\nalice:x:1000:\n"


def test_an_unnamed_agent_uid_becomes_sandbox_with_the_workdir_as_home() -> None:
    passwd, group = account_lines(HOST_PASSWD, HOST_GROUP, uid=61002, gid=61002, home="/w", shell="/bin/bash")
    assert passwd.splitlines()[-1] == "sandbox:x:61002:61002:openshell-sandbox agent:/w:/bin/bash"
    assert group.splitlines()[-1] == "sandbox:x:61002:"
    # the name is one account's: the host's own "sandbox" (other ids) is left out
    assert [line.split(":")[0] for line in passwd.splitlines()].count("sandbox") == 1
    assert "root:x:0:0:root:/root:/bin/bash" in passwd.splitlines()


def test_an_agent_uid_the_host_names_keeps_its_entry() -> None:
    passwd, group = account_lines(HOST_PASSWD, HOST_GROUP, uid=1000, gid=1000, home="/w", shell="/bin/sh")
    assert passwd == HOST_PASSWD and group == HOST_GROUP
