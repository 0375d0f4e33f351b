# SPDX-License-Identifier: BSD-3-Clause
"""to_libconfig: a YAML value as libconfig text (pboxd's configuration syntax).

Mappings become groups `{ key = value; ... }`, lists of mappings or of lists become
lists `( ... )`, other lists arrays `[ ... ]`, strings are quoted with JSON escapes
(which libconfig reads), booleans `true`/`false`, numbers as Python writes them (a float
keeps its decimal point, so libconfig reads it as a float). None is refused: libconfig
has no null, and a silently dropped key would hide an inventory mistake.
"""
import json
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError


def _value(v, path):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(str(v))
    if isinstance(v, Mapping):
        body = " ".join("%s = %s;" % (k, _value(x, "%s.%s" % (path, k)))
                        for k, x in v.items() if x is not None or _refuse(path, k))
        return "{ " + body + " }"
    if isinstance(v, (list, tuple)):
        items = [_value(x, "%s[%d]" % (path, i)) for i, x in enumerate(v)]
        if v and all(isinstance(x, (Mapping, list, tuple)) for x in v):
            return "( " + ", ".join(items) + " )"
        return "[ " + ", ".join(items) + " ]"
    raise AnsibleFilterError("to_libconfig: %s: cannot express %r (%s) in libconfig"
                             % (path or "value", v, type(v).__name__))


def _refuse(path, key):
    raise AnsibleFilterError("to_libconfig: %s.%s is null: libconfig has no null; remove "
                             "the key or give it a value" % (path, key))


def to_libconfig(value, name=""):
    return _value(value, name)


class FilterModule:
    def filters(self):
        return {"to_libconfig": to_libconfig}
