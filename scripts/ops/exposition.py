"""The Prometheus text exposition as the ops scripts read it: samples and family types.

One parser for e2e_check.py, e2e_gen_ai.py and e2e_ui.py, so every check reads
/metrics the same way (label values with escaped quotes included).
"""
import re

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text):
    """[(name, {labels}, value)] and {family: type}."""
    samples, types = [], {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(None, 3)
            types[name] = typ.strip()
            continue
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        if m:
            labels = dict(LABEL.findall(m.group(3) or ""))
            try:
                samples.append((m.group(1), labels, float(m.group(4))))
            except ValueError:
                pass
    return samples, types


def total(samples, name, **match):
    """The sum of the samples of `name` whose labels include every `match`."""
    return sum(v for n, l, v in samples if n == name and all(l.get(k) == val for k, val in match.items()))
