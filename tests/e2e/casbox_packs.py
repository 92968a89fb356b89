"""Walking a casbox store's packs from outside, by the frame headers
alone (doc/casbox-format.md, "Pack header", "Frame", "Meta frame"):
what tests and benches count or damage. No key is needed: magic,
version, kind and size are in the clear."""

import collections
import glob
import os
import struct

PACK_HEADER_SIZE = 20
# meta frame kinds (byte 5 of a "CBMF" header)
META_KINDS = {1: "recovery record", 2: "DEK update", 3: "mailbox record",
              4: "blob keys", 5: "copy record"}


def pack_frames(root):
    """(path, offset, magic, size) of every frame, walking the packs of
    the casbox root in name order."""
    frames = []
    for path in sorted(glob.glob(os.path.join(root, "packs",
                                              "pack-*.cbp"))):
        with open(path, "rb") as f:
            data = f.read()
        off = PACK_HEADER_SIZE
        while off + 12 <= len(data):
            magic = data[off:off + 4]
            assert magic in (b"CBFR", b"CBMF"), (path, off, magic)
            size = struct.unpack_from("<I", data, off + 8)[0]
            assert size > 0, (path, off)
            frames.append((path, off, magic, size))
            off += size
    return frames


def frame_bytes(root, count=4):
    """The first count bytes of every frame: [(path, off, magic, size,
    head)]."""
    out = []
    by_path = collections.defaultdict(list)
    for frame in pack_frames(root):
        by_path[frame[0]].append(frame)
    for path, frames in by_path.items():
        with open(path, "rb") as f:
            data = f.read()
        for _, off, magic, size in frames:
            out.append((path, off, magic, size, data[off:off + count]))
    return out


def frame_census(root):
    """{label: (frames, bytes)} by frame kind: "blob v<version>" for blob
    frames, the META_KINDS name for meta frames."""
    census = collections.Counter()
    counts = collections.Counter()
    for _, _, magic, size, head in frame_bytes(root, 6):
        if magic == b"CBFR":
            label = "blob v%d" % head[4]
        else:
            label = META_KINDS.get(head[5], "meta kind %d" % head[5])
        census[label] += size
        counts[label] += 1
    return {k: (counts[k], census[k]) for k in sorted(census)}
