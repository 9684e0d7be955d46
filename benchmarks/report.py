"""What the benchmark scripts share to report: the host's name and the tables they write into
docs/ between markers."""
import platform
import subprocess
import sys


def host_name():
    """`lscpu`'s model name (the CPU the figures were measured on), with its CPU family and model
    numbers where lscpu gives them: one name ("AMD EPYC") covers several generations."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        fields = {}
        for line in out.splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
        name = fields.get("Model name")
        if name:
            if fields.get("CPU family") and fields.get("Model"):
                name += f", CPU family {fields['CPU family']} model {fields['Model']}"
            return name
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_table(doc_path, begin, end, table):
    """Replaces what lies between the markers `begin` and `end` in `doc_path` with `table`."""
    doc = open(doc_path).read()
    if begin not in doc or end not in doc:
        sys.exit(f"{doc_path} lacks the markers {begin} / {end}")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(doc_path, "w") as f:
        f.write(head + begin + "\n" + table + "\n" + end + tail)


def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"
