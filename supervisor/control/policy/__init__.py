"""Control's policy engine: load and validate, compile, decide, explain and hot-reload (docs/reference/policy.md).

Everything here is pure except ``store`` (which reads the policy file and, in ``watch_policy_file``, sleeps).
"""

from .compiled import CompiledEndpoint, CompiledPolicy, compile_policy
from .decide import BodyRoute, body_route, decide_l4, decide_l7, quarantine_decision
from .decision import Decision, DenyReason, L4Request, Verdict
from .errors import PolicyError, PolicyInvalid, PolicyWarning
from .hosts import normalize_request_host
from .identity import BinaryIdentity, DigestPins, PinViolation
from .model import (
    AccessPreset,
    Binary,
    Endpoint,
    Enforcement,
    FilesystemPolicy,
    L7Rule,
    LandlockPolicy,
    NetworkRule,
    Policy,
    ProcessPolicy,
    Protocol,
    QueryMatcher,
    TlsMode,
)
from .paths import CanonicalTarget, TargetError, canonicalize_target, parse_query
from .schema import load_default_policy, load_policy_file, load_policy_text
from .store import FailureMode, PolicyFileWatcher, PolicySnapshot, PolicyStatus, PolicyStore, watch_policy_file

__all__ = [
    "AccessPreset",
    "Binary",
    "BinaryIdentity",
    "BodyRoute",
    "CanonicalTarget",
    "CompiledEndpoint",
    "CompiledPolicy",
    "Decision",
    "DenyReason",
    "DigestPins",
    "Endpoint",
    "Enforcement",
    "FailureMode",
    "FilesystemPolicy",
    "L4Request",
    "L7Rule",
    "LandlockPolicy",
    "NetworkRule",
    "PinViolation",
    "Policy",
    "PolicyError",
    "PolicyFileWatcher",
    "PolicyInvalid",
    "PolicySnapshot",
    "PolicyStatus",
    "PolicyStore",
    "PolicyWarning",
    "ProcessPolicy",
    "Protocol",
    "QueryMatcher",
    "TargetError",
    "TlsMode",
    "Verdict",
    "body_route",
    "canonicalize_target",
    "compile_policy",
    "decide_l4",
    "decide_l7",
    "load_default_policy",
    "load_policy_file",
    "load_policy_text",
    "normalize_request_host",
    "parse_query",
    "quarantine_decision",
    "watch_policy_file",
]
