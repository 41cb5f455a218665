#!/usr/bin/python3
"""Writes grove-node's manual page (roff, section 1) from its --help text, so the two never
disagree. The build runs it on the binary it made (node/CMakeLists.txt); `cmake --install`
puts the page in share/man/man1.

usage: grove-man.py GROVE_NODE OUT.1
"""
import datetime
import os
import re
import subprocess
import sys


def roff(text):
    """Plain text as roff: backslashes and hyphens escaped, other than ASCII as groff's Unicode
    escapes, no line starting with a control character."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    text = "".join(c if ord(c) < 128 else "\\[u%04X]" % ord(c) for c in text)  # φ, θ, ·
    if text.startswith((".", "'")):
        text = "\\&" + text
    return text


def page(help_text, version):
    lines = help_text.rstrip("\n").split("\n")
    title = lines[0]
    name, _, summary = title.partition(":")
    epoch = os.environ.get("SOURCE_DATE_EPOCH")  # (reproducible builds)
    when = (datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).date()
            if epoch else datetime.date.today()).isoformat()
    out = ['.TH GROVE\\-NODE 1 "%s" "%s" "User Commands"' % (when, roff(version)),
           ".SH NAME", "%s \\- %s" % (roff(name.strip()), roff(summary.strip())),
           ".SH SYNOPSIS"]
    i = 1
    while i < len(lines) and not lines[i].startswith("Usage:"):
        i += 1
    i += 1
    # Usage lines: "  grove-node ARGS   what it does", continuations indented further.
    while i < len(lines) and lines[i].strip():
        m = re.match(r"^  (grove-node.*?)(?:\s{2,}(\S.*))?$", lines[i])
        if m:
            out += [".TP", ".B " + roff(m.group(1).strip())]
            if m.group(2):
                out.append(roff(m.group(2)))
        else:
            out.append(roff(lines[i].strip()))
        i += 1
    out += [".SH DESCRIPTION",
            "Each node runs a Kademlia DHT for membership and metadata, averages with NoLoCo "
            "(random pairs) by default and with DiLoCo (group all\\-reduce) on request, and "
            "tolerates nodes that join and leave mid\\-run. One machine starts a swarm with "
            "\\fB\\-\\-bootstrap\\fR, which prints the command that joins it; the others run "
            "that command. A training script in PyTorch attaches to its node through the "
            "\\fBgrove\\fR Python package (\\fB\\-\\-workload external\\fR)."]
    # Option sections: a line ending in ':' at column 0 opens one; an option line starts with
    # two spaces and '--'; deeper-indented lines continue the option before them.
    section = None
    for line in lines[i:]:
        if not line.strip():
            continue
        if not line.startswith(" ") and line.rstrip().endswith(":"):
            section = line.rstrip()[:-1]
            out.append(".SH " + roff(section.upper()))
            continue
        if not line.startswith(" "):  # a closing paragraph (the exit status)
            if section != "EXIT STATUS":
                section = "EXIT STATUS"
                out.append(".SH EXIT STATUS")
            out.append(roff(line.strip()))
            continue
        m = re.match(r"^  (--?\S.*?)(?:\s{2,}(\S.*))?$", line)
        if m and not line.startswith("   "):
            out += [".TP", ".B " + roff(m.group(1).strip())]
            if m.group(2):
                out.append(roff(m.group(2)))
        else:
            out.append(roff(line.strip()))
    out += [".SH FILES",
            ".TP", ".I ~/.local/share/grove\\-node",
            "the default state directory: identity key, swarm key, checkpoints, contacts, the "
            "trainer socket and \\fIblobs/\\fR (the model\\-sized state, on disk).",
            ".TP", ".I /var/lib/grove\\-node/NAME",
            "the state directory of the systemd unit \\fBgrove\\-node@NAME.service\\fR, whose "
            "arguments come from \\fI/etc/grove\\-node/NAME.conf\\fR.",
            ".SH SEE ALSO",
            "The README and docs/ of the source (usage.md, python.md, ALGORITHMS.md)."]
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    binary, target = sys.argv[1], sys.argv[2]
    help_text = subprocess.run([binary, "--help"], check=True, capture_output=True,
                               text=True).stdout
    version = subprocess.run([binary, "--version"], check=True, capture_output=True,
                             text=True).stdout.strip()
    tmp = target + ".tmp"
    with open(tmp, "w") as f:
        f.write(page(help_text, version))
    os.replace(tmp, target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
