# ruff: noqa: E501  (one violation per line, as the test prints it)
"""The public callables of the daemons that still take or return raw JSON objects (tests/unit/test_interfaces.py).

Each is a debt: type it (a frozen dataclass with ``to_wire``/``from_wire``) and take its line off. The list only
shrinks: the test fails on a new violation and on an entry that no longer is one.
"""

NOT_YET_TYPED: frozenset[str] = frozenset(
    {
        "supervisor.control.advisor.Suggestion.__init__: parameter 'document' is dict[str, typing.Any]",
        "supervisor.control.advisor.render: parameter 'document' is dict[str, typing.Any]",
        "supervisor.control.api.ControlState.activity: returns dict[str, typing.Any]",
        "supervisor.control.api.ControlState.denials_json: returns dict[str, typing.Any]",
        "supervisor.control.api.ControlState.refresh_status: returns dict[str, typing.Any]",
        "supervisor.control.api.ControlState.status: returns dict[str, typing.Any]",
        "supervisor.control.api_tls.TlsApiListener.__init__: annotations cannot be resolved (name 'ApiServer' is not defined)",
        "supervisor.control.canary.FenceCanary.__init__: parameter 'last' is dict[str, typing.Any] | None",
        "supervisor.control.canary.FenceCanary.status: returns dict[str, typing.Any]",
        "supervisor.control.certificates.CertificateFacts.to_json: returns dict[str, object]",
        "supervisor.control.daemon.ControlDaemon.activity: returns dict[str, typing.Any]",
        "supervisor.control.daemon.ControlDaemon.denials_json: returns dict[str, typing.Any]",
        "supervisor.control.daemon.ControlDaemon.refresh_status: returns dict[str, typing.Any]",
        "supervisor.control.daemon.ControlDaemon.status: returns dict[str, typing.Any]",
        "supervisor.control.denials.DenialEntry.from_json: parameter 'raw' is dict[str, typing.Any]",
        "supervisor.control.denials.DenialEntry.to_json: returns dict[str, typing.Any]",
        "supervisor.control.denials.DenialTable.to_json: returns dict[str, typing.Any]",
        "supervisor.control.denials.L7Sample.to_json: returns dict[str, typing.Any]",
        "supervisor.control.inference.router.InferenceRouter.status: returns dict[str, typing.Any]",
        "supervisor.control.inference.routes.InferenceRoutes.to_json: returns dict[str, typing.Any]",
        "supervisor.control.inference.routes.Route.to_json: returns dict[str, typing.Any]",
        "supervisor.control.inference.shapes.model_body: parameter 'value' is dict[str, typing.Any]",
        "supervisor.control.inference.shapes.read_body: returns dict[str, typing.Any]",
        "supervisor.control.inference.store.RoutesStore.status: returns dict[str, typing.Any]",
        "supervisor.control.l7.record.RequestRecord.__init__: parameter 'extra' is dict[str, typing.Any]",
        "supervisor.control.l7.record.RequestRecord.event_fields: returns dict[str, typing.Any]",
        "supervisor.control.l7.session.entry.inspect: parameter 'event_fields' is collections.abc.Mapping[str, typing.Any] | None",
        "supervisor.control.l7.session.state.Session.__init__: parameter 'event_fields' is collections.abc.Mapping[str, typing.Any]",
        "supervisor.control.policy.decision.Decision.to_json: returns dict[str, typing.Any]",
        "supervisor.control.policy.errors.PolicyError.to_json: returns dict[str, typing.Any]",
        "supervisor.control.policy.errors.PolicyInvalid.to_json: returns list[dict[str, typing.Any]]",
        "supervisor.control.policy.errors.PolicyWarning.to_json: returns dict[str, typing.Any]",
        "supervisor.control.policy.identity.BinaryIdentity.to_json: returns dict[str, typing.Any]",
        "supervisor.control.policy.model.Endpoint.to_json: returns dict[str, typing.Any]",
        "supervisor.control.policy.model.FilesystemPolicy.to_json: returns dict[str, typing.Any]",
        "supervisor.control.policy.model.L7Rule.to_json: returns dict[str, typing.Any]",
        "supervisor.control.policy.model.LandlockPolicy.to_json: returns dict[str, typing.Any]",
        "supervisor.control.policy.model.NetworkRule.to_json: returns dict[str, typing.Any]",
        "supervisor.control.policy.model.Policy.static_json: returns dict[str, typing.Any]",
        "supervisor.control.policy.model.Policy.to_json: returns dict[str, typing.Any]",
        "supervisor.control.policy.model.ProcessPolicy.to_json: returns dict[str, typing.Any]",
        "supervisor.control.policy.schema_rpc.read_options: returns dict[str, typing.Any]",
        "supervisor.control.policy.store.PolicyStore.status_json: returns dict[str, typing.Any]",
        "supervisor.control.proxy_listener.ProxyListener.status: returns dict[str, typing.Any]",
        "supervisor.control.workload_gone.WorkloadGone.status: returns dict[str, typing.Any] | None",
    }
)
