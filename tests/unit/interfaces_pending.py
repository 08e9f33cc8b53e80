# ruff: noqa: E501  (one violation per line, as the test prints it)
"""The public callables of the daemons that still take or return raw JSON objects (tests/unit/test_interfaces.py).

Each is a debt: type it (a frozen dataclass with ``to_wire``/``from_wire``) and take its line off. The list only
shrinks: the test fails on a new violation and on an entry that no longer is one.
"""

NOT_YET_TYPED: frozenset[str] = frozenset(
    {
        "supervisor.boundary.capture.calls.call: parameter 'args' is collections.abc.Mapping[str, typing.Any]",
        "supervisor.boundary.capture.calls.prepare: parameter 'capture' is collections.abc.Mapping[str, typing.Any]",
        "supervisor.boundary.capture.calls.prepare: returns tuple[list[str], dict[str, typing.Any], list[int]]",
        "supervisor.boundary.capture.connect_notify.ConnectNotifier.__init__: parameter 'on_event' is collections.abc.Callable[[supervisor.protocol.event_names.EventName, dict[str, object]], None] | None",
        "supervisor.boundary.capture.fence_watch.FenceWatch.__init__: parameter 'inspect' is collections.abc.Callable[[], collections.abc.Awaitable[dict[str, typing.Any]]]",
        "supervisor.boundary.capture.fence_watch.FenceWatch.__init__: parameter 'on_lost' is collections.abc.Callable[[dict[str, typing.Any]], collections.abc.Awaitable[None]]",
        "supervisor.boundary.capture.setup.inspect: returns dict[str, typing.Any]",
        "supervisor.boundary.capture.setup.prepare: returns tuple[dict[str, int], dict[str, typing.Any]]",
        "supervisor.boundary.capture.setup.probe: returns dict[str, typing.Any]",
        "supervisor.boundary.forkimage.init.exec_init_image: parameter 'root' is collections.abc.Mapping[str, typing.Any] | None",
        "supervisor.boundary.forkimage.init.init_entry: parameter 'boot' is dict[str, typing.Any]",
        "supervisor.boundary.forkimage.init.init_main: parameter 'root' is dict[str, typing.Any] | None",
        "supervisor.boundary.forkimage.messages.CaptureCall.__init__: parameter 'args' is collections.abc.Mapping[str, typing.Any]",
        "supervisor.boundary.forkimage.messages.NamespacePlan.__init__: parameter 'capture' is dict[str, typing.Any] | None",
        "supervisor.boundary.forkimage.messages.NamespacePlan.__init__: parameter 'root' is dict[str, typing.Any] | None",
        "supervisor.boundary.forkimage.messages.PrepareReply.__init__: parameter 'report' is collections.abc.Mapping[str, typing.Any]",
        "supervisor.boundary.forkimage.messages.SpareLease.__init__: parameter 'confinement' is collections.abc.Mapping[str, typing.Any]",
        "supervisor.boundary.forkimage.messages.SpawnRequest.__init__: parameter 'spec' is collections.abc.Mapping[str, typing.Any]",
        "supervisor.boundary.forkimage.messages.request_from_wire: parameter 'data' is collections.abc.Mapping[str, typing.Any]",
        "supervisor.boundary.forkimage.spawner.Spawner.replenish: returns tuple[dict[str, typing.Any], list[int], int] | None",
        "supervisor.boundary.forkimage.spawner.Spawner.spawn: returns tuple[dict[str, typing.Any], list[int]]",
        "supervisor.boundary.forkimage.wire.decode: returns tuple[dict[str, typing.Any], list[int]]",
        "supervisor.boundary.forkimage.wire.encode: parameter 'message' is collections.abc.Mapping[str, typing.Any]",
        "supervisor.boundary.forkimage.wire.receive: returns tuple[dict[str, typing.Any], list[int]] | None",
        "supervisor.boundary.forkimage.wire.send: parameter 'message' is collections.abc.Mapping[str, typing.Any]",
        "supervisor.boundary.forkimage.zygote.CaptureWork.call: parameter 'args' is collections.abc.Mapping[str, typing.Any]",
        "supervisor.boundary.forkimage.zygote.CaptureWork.prepare: parameter 'capture' is collections.abc.Mapping[str, typing.Any]",
        "supervisor.boundary.forkimage.zygote.CaptureWork.prepare: returns tuple[list[str], dict[str, typing.Any], list[int]]",
        "supervisor.boundary.forkimage.zygote.Zygote.handle: parameter 'message' is dict[str, typing.Any]",
        "supervisor.boundary.forkimage.zygote.Zygote.reply: parameter 'message' is collections.abc.Mapping[str, typing.Any]",
        "supervisor.boundary.limits.WorkloadLimits.now: returns dict[str, typing.Any]",
        "supervisor.boundary.metrics.BoundaryState.limits_now: returns dict[str, typing.Any]",
        "supervisor.boundary.process.launcher.Launcher.capture_call: parameter 'args' is collections.abc.Mapping[str, typing.Any]",
        "supervisor.boundary.process.launcher.Launcher.capture_call: returns dict[str, typing.Any]",
        "supervisor.boundary.process.launcher.Prepared.__init__: parameter 'report' is dict[str, typing.Any]",
        "supervisor.boundary.process.table.ProcessEntry.describe: returns dict[str, typing.Any]",
        "supervisor.boundary.process.table.ProcessTable.live: returns list[dict[str, typing.Any]]",
        "supervisor.boundary.state.DaemonState.limits_now: returns dict[str, typing.Any]",
    }
)
