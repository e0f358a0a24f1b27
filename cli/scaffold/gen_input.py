#!/usr/bin/env python3
"""Input and constants files for the function plover init made.

  python3 gen_input.py input.bin [N]                 N float32s x[i] = i/2 (default N 1000)
  python3 gen_input.py --constants constants.bin A B  the constants: a, b as two float32s

Every file is raw little-endian float32s, no header: a request body is the
input bytes as they are, and the constants file is put on the device as it is.
"""
import struct
import sys


def write(path, values):
    with open(path, "wb") as f:
        f.write(struct.pack("<%df" % len(values), *values))


def main(args):
    if len(args) == 4 and args[0] == "--constants":
        write(args[1], [float(args[2]), float(args[3])])
    elif len(args) in (1, 2) and not args[0].startswith("-"):
        n = int(args[1]) if len(args) == 2 else 1000
        write(args[0], [i / 2 for i in range(n)])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
