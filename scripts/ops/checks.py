"""What the manifest checks share: a PASS/FAIL tally, and a label selector's match.

Imported by check-manifests.py (the shipped overlays) and check-inject.py (what
`tokentap inject` writes), which run from this directory.
"""


class Checker:
    """Prints one PASS or FAIL line per check and counts them."""

    def __init__(self):
        self.failures = 0
        self.passes = 0

    def ok(self, cond, what, detail=""):
        if cond:
            self.passes += 1
            print(f"PASS {what}")
        else:
            self.failures += 1
            print(f"FAIL {what}{': ' + str(detail) if detail else ''}")
        return cond


def selects(selector, labels):
    """A matchLabels selector, or a plain label map (an InferencePool v1alpha2's), against a
    label map. These manifests use no matchExpressions: a selector with them, or an empty
    one, selects nothing here."""
    selector = selector or {}
    if not isinstance(selector, dict) or selector.get("matchExpressions"):
        return False
    wanted = selector.get("matchLabels", selector)
    return bool(wanted) and isinstance(wanted, dict) and all(labels.get(k) == v for k, v in wanted.items())
