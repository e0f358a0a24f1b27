"""An in-tree PEP 517 build backend for plover-client, with no build
dependencies: `pip install clients/python` works without network access
(setuptools, the usual backend, is fetched from an index into pip's isolated
build environment). It builds a pure-Python wheel of the plover package,
and an sdist of this directory. Metadata comes from pyproject.toml's
[project] table (read with a small parser: tomllib is Python 3.11+)."""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _text():
    return open(os.path.join(_HERE, "pyproject.toml"), encoding="utf-8").read()


def _section():
    # [project] up to the next table, or the end of the file.
    return re.search(r"^\[project\]\n(.*?)(?=^\[|\Z)", _text(), re.S | re.M).group(1)


def _project():
    text = _text()
    section = _section()
    fields = dict(re.findall(r'^([a-z-]+) = "([^"]*)"$', section, re.M))
    extras = {}
    opt = re.search(r"^\[project\.optional-dependencies\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M)
    if opt:
        for name, deps in re.findall(r"^([a-z0-9_-]+) = \[(.*)\]$", opt.group(1), re.M):
            extras[name] = re.findall(r'"([^"]+)"', deps)
    return fields, extras


def _metadata():
    f, extras = _project()
    lines = ["Metadata-Version: 2.1", "Name: " + f["name"], "Version: " + f["version"],
             "Summary: " + f.get("description", ""), "Requires-Python: " + f.get("requires-python", ">=3")]
    deps = re.search(r'^dependencies = \[(.*)\]$', _section(), re.M)
    for d in re.findall(r'"([^"]+)"', deps.group(1)) if deps else []:
        lines.append("Requires-Dist: " + d)
    for extra, deps in sorted(extras.items()):
        lines.append("Provides-Extra: " + extra)
        lines += ["Requires-Dist: %s; extra == \"%s\"" % (d, extra) for d in deps]
    readme = os.path.join(_HERE, "README.md")
    body = open(readme, encoding="utf-8").read() if os.path.exists(readme) else ""
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + body, f


def _dist(f):
    return f["name"].replace("-", "_") + "-" + f["version"]


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = []
    pkg = os.path.join(_HERE, "plover")
    for fn in sorted(os.listdir(pkg)):
        if fn.endswith(".py"):
            with open(os.path.join(pkg, fn), "rb") as fh:
                files.append(("plover/" + fn, fh.read()))
    return _wheel(wheel_directory, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """pip install -e: a wheel whose .pth file puts this directory on
    sys.path, so edits to plover/ take effect without reinstalling."""
    return _wheel(wheel_directory, [("plover_client_editable.pth", (_HERE + "\n").encode())])


def _wheel(wheel_directory, files):
    meta, f = _metadata()
    dist = _dist(f)
    name = dist + "-py3-none-any.whl"
    files = list(files)
    info = dist + ".dist-info/"
    files.append((info + "METADATA", meta.encode()))
    files.append((info + "WHEEL", b"Wheel-Version: 1.0\nGenerator: plover_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"))
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            z.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append("%s,sha256=%s,%d" % (path, digest, len(data)))
        record.append(info + "RECORD,,")
        z.writestr(info + "RECORD", "\n".join(record) + "\n")
    return name


def build_sdist(sdist_directory, config_settings=None):
    meta, f = _metadata()
    dist = _dist(f)
    name = dist + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ["pyproject.toml", "README.md", "_build/plover_build.py"] + \
                ["plover/" + fn for fn in sorted(os.listdir(os.path.join(_HERE, "plover"))) if fn.endswith(".py")]:
            t.add(os.path.join(_HERE, rel), arcname=dist + "/" + rel)
        data = meta.encode()
        ti = tarfile.TarInfo(dist + "/PKG-INFO")
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
    return name
