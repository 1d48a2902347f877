"""Kubernetes' own grammars for its own fields: names, label keys and values, quantities, images.

The name and label rules are those of k8s.io/apimachinery/pkg/util/validation (the same regular
expressions and lengths), written as functions that return what is wrong, as apimachinery's do.
No Python library carries them: the `kubernetes` client validates types and required fields only,
and importing it takes about 2 s, more than `kuberl validate` may spend. Quantities follow
resource.Quantity's grammar; tests/test_kube_grammar.py checks the parser against the client's own
`kubernetes.utils.parse_quantity`, and the real API server tests check the grammars end to end.
Image references are parsed by docker-image-py, a port of distribution/reference, the parser
containerd and the kubelet use.

Each pydantic type carries both halves: the Python check, and the JSON schema (pattern, length or
CEL rule) that the CRD gives the API server.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Callable

from pydantic import AfterValidator, Field, PlainValidator, WithJsonSchema

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = rf"^{_DNS1123_LABEL}$"
DNS1123_SUBDOMAIN = rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$"
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
_NAME_PART = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
LABEL_VALUE = rf"^({_NAME_PART})?$"
# One pattern for the CRD: an optional DNS-1123 subdomain prefix, then a name part of <= 63.
LABEL_KEY = rf"^({_DNS1123_LABEL}(\.{_DNS1123_LABEL})*/)?([A-Za-z0-9][-A-Za-z0-9_.]{{0,61}})?[A-Za-z0-9]$"
LABEL_KEY_MAX = 253 + 1 + 63
ANNOTATIONS_MAX_BYTES = 256 * 1024


def _pattern_errors(value: str, pattern: str, max_length: int, what: str, example: str) -> list[str]:
    errors = []
    if len(value) > max_length:
        errors.append(f"must be no more than {max_length} characters")
    if not re.match(pattern, value):
        errors.append(f"{what} (e.g. {example!r})")
    return errors


def dns1123_label_errors(value: str) -> list[str]:
    return _pattern_errors(
        value,
        DNS1123_LABEL,
        63,
        "must be a DNS-1123 label: lower-case letters, digits and '-', starting and ending with a letter or digit",
        "my-name",
    )


def dns1123_subdomain_errors(value: str) -> list[str]:
    return _pattern_errors(
        value,
        DNS1123_SUBDOMAIN,
        253,
        "must be a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit",
        "example.com",
    )


def dns1035_label_errors(value: str) -> list[str]:
    return _pattern_errors(
        value,
        DNS1035_LABEL,
        63,
        "must be a DNS-1035 label: lower-case letters, digits and '-', starting with a letter and ending with a letter or digit",
        "my-name",
    )


def qualified_name_errors(value: str) -> list[str]:
    """A label or annotation key: [prefix/]name, prefix a DNS-1123 subdomain, name <= 63."""
    prefix, slash, name = value.rpartition("/")
    if slash and not prefix:
        return ["prefix part must be non-empty"]
    if "/" in prefix:
        return ["a qualified name must have at most one '/' (prefix/name)"]
    errors = [f"prefix part {e}" for e in dns1123_subdomain_errors(prefix)] if slash else []
    if not name:
        return errors + ["name part must be non-empty"]
    errors += _pattern_errors(
        name,
        rf"^{_NAME_PART}$",
        63,
        "name part must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
        "my.key",
    )
    return errors


def label_value_errors(value: str) -> list[str]:
    return _pattern_errors(
        value, LABEL_VALUE, 63, "must be empty or letters, digits, '-', '_' or '.', starting and ending with a letter or digit", "v1.2"
    )


def generate_name_errors(value: str) -> list[str]:
    """metadata.generateName: the server appends 5 characters, and the result must be a valid name."""
    return dns1035_label_errors(value.rstrip("-") or "-") if value else ["must not be empty"]


def _checked(errors_of: Callable[[str], list[str]]) -> AfterValidator:
    def check(value: str) -> str:
        errors = errors_of(value)
        if errors:
            raise ValueError(f"{value!r}: " + "; ".join(errors))
        return value

    return AfterValidator(check)


def _cel_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


LabelKey = Annotated[
    str, _checked(qualified_name_errors), WithJsonSchema({"type": "string", "maxLength": LABEL_KEY_MAX, "pattern": LABEL_KEY})
]
LabelValue = Annotated[str, _checked(label_value_errors), WithJsonSchema({"type": "string", "maxLength": 63, "pattern": LABEL_VALUE})]
DNSSubdomain = Annotated[
    str, _checked(dns1123_subdomain_errors), WithJsonSchema({"type": "string", "maxLength": 253, "pattern": DNS1123_SUBDOMAIN})
]
DNSLabel = Annotated[str, _checked(dns1123_label_errors), WithJsonSchema({"type": "string", "maxLength": 63, "pattern": DNS1123_LABEL})]

# --- paths and names inside a container ---------------------------------------------------------


def mount_path_errors(value: str) -> list[str]:
    """A container path spelt one way only, so that "is it under /tmp?" is a prefix test."""
    if not value.startswith("/"):
        return ["must be an absolute path (start with /)"]
    if value == "/":
        return ["must not be / (it would hide the image's whole filesystem)"]
    if value.endswith("/") or "//" in value:
        return ["must not end with / or contain //"]
    if any(part in (".", "..") for part in value.split("/")):
        return ["must not contain . or .. segments"]
    return []


MOUNT_PATH_MAX = 1024
MOUNT_PATH_CEL = (
    "self.startsWith('/') && self != '/' && !self.endsWith('/') && !self.contains('//')"
    " && !self.contains('/./') && !self.endsWith('/.') && !self.contains('/../') && !self.endsWith('/..')"
)
MountPath = Annotated[
    str,
    _checked(mount_path_errors),
    WithJsonSchema(
        {
            "type": "string",
            "minLength": 2,
            "maxLength": MOUNT_PATH_MAX,
            "x-kubernetes-validations": [
                {"rule": MOUNT_PATH_CEL, "message": "must be an absolute path other than /, without //, . or .. segments or a trailing /"},
            ],
        }
    ),
    Field(min_length=2, max_length=MOUNT_PATH_MAX),
]
"""A container path: absolute, not /, with no //, . or .. segments and no trailing /."""

ENV_VAR_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"


def env_var_name_errors(value: str) -> list[str]:
    return _pattern_errors(
        value,
        ENV_VAR_NAME,
        256,
        "must be an environment variable name: letters, digits, '_', '-' or '.', not starting with a digit",
        "MY_VAR",
    )


EnvVarName = Annotated[str, _checked(env_var_name_errors), WithJsonSchema({"type": "string", "maxLength": 256, "pattern": ENV_VAR_NAME})]


def label_keys_cel(expression: str) -> str:
    """CEL: every key of the map `expression` is a label key (OpenAPI has no pattern for map keys)."""
    return f"{expression}.all(k, k.size() <= {LABEL_KEY_MAX} && k.matches({_cel_string(LABEL_KEY)}))"


LABEL_KEYS_CEL = {
    "rule": label_keys_cel("self"),
    "message": "keys must be label keys: [prefix/]name, prefix a DNS subdomain, name letters, digits, '-', '_' or '.'",
}


def label_map(max_items: int) -> Any:
    """dict[LabelKey, LabelValue] of at most `max_items`, checked by the API server too."""
    schema = {
        "type": "object",
        "maxProperties": max_items,
        "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE},
        "x-kubernetes-validations": [LABEL_KEYS_CEL],
    }
    return Annotated[dict[LabelKey, LabelValue], Field(max_length=max_items), WithJsonSchema(schema)]


# matchLabels of a label selector. Its keys are checked here only: selectors sit in lists of
# unbounded length, and a CEL rule per key there would exceed the API server's cost budget.
SelectorLabels = Annotated[
    dict[LabelKey, LabelValue],
    WithJsonSchema({"type": "object", "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE}}),
]


# --- resource.Quantity -------------------------------------------------------------------------

_QUANTITY = re.compile(r"^(?P<number>[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+))(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_SUFFIX = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_MAX_EXPONENT = 1000  # resource.Quantity saturates far below this; bounded work on "1e999999999"


def parse_quantity(value: int | str) -> Decimal:
    """The value of a Kubernetes quantity (an int, or a string such as '500m', '4Gi', '1e3')."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{value!r} is not a Kubernetes quantity: write an integer or a string such as '500m' or '4Gi'")
    if isinstance(value, int):
        return Decimal(value)
    match = _QUANTITY.match(value)
    if not match:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 4Gi, 2)")
    suffix = match["suffix"] or ""
    try:
        number = Decimal(match["number"])
        if suffix not in _SUFFIX:  # an exponent such as e3 ("E" alone is exa, "Ei" exbi)
            exponent = int(suffix[1:])
            if abs(exponent) > _MAX_EXPONENT:
                raise ValueError(f"{value!r}: exponent out of range")
            return number.scaleb(exponent)
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 4Gi, 2)") from None
    return number * _SUFFIX[suffix]


def _non_negative_quantity(value: object) -> int | str:
    if parse_quantity(value) < 0:  # type: ignore[arg-type]
        raise ValueError(f"{value!r}: a resource quantity must not be negative")
    return value  # type: ignore[return-value]


# An int or a string, like Kubernetes' resource.Quantity ("int-or-string" in the CRD). The CRD
# says "non-negative" as controller-gen says a Quantity: a pattern for the string (without a
# leading '-') and a minimum for the integer. CEL's quantity library would cost more than the API
# server's budget allows over the four roles' maps (measured: 2x over).
NON_NEGATIVE_QUANTITY = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
Quantity = Annotated[
    int | str,
    PlainValidator(_non_negative_quantity),  # one message for a wrong type, not one per union branch
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": NON_NEGATIVE_QUANTITY,
            "minimum": 0,
        }
    ),
]


# --- image references ---------------------------------------------------------------------------


def image_errors(value: str) -> list[str]:
    """What distribution/reference (containerd, the kubelet) would refuse in an image reference."""
    from docker_image import reference  # imported on use: validation without an image stays fast

    try:
        reference.Reference.parse_normalized_named(value)
    except reference.InvalidReference as exc:
        return [f"not an image reference ({exc}); e.g. ghcr.io/org/kuberl-trainer:0.4 or name@sha256:<64 hex>"]
    except Exception as exc:  # the library's own errors for odd input (e.g. "invalid checksum digest")
        return [f"not an image reference ({exc})"]
    return []


def _image_schema(schema: dict[str, Any]) -> None:
    from docker_image import regexp  # only the CRD generator needs the pattern

    # The same language without a POSIX class, which Go's RE2 knows but Python's re (and so other
    # schema checkers) reads differently.
    schema["pattern"] = regexp.REFERENCE_PAT.replace("[[:xdigit:]]", "[0-9a-fA-F]")


ImageReference = Annotated[str, _checked(image_errors), Field(min_length=1, max_length=512, json_schema_extra=_image_schema)]
