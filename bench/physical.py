"""Physical limits of this machine, measured in the same run as the
storage suite so each figure can be set against what the hardware allows:
sequential write/read bandwidth of the disk the mail homes live on, fsync
latency, zstd decode throughput (zstd CLI -b mode on corpus bytes) and
libsodium XChaCha20-Poly1305 throughput (bench/physical-aead.c)."""

import mmap
import os
import re
import subprocess
import time

from stats import summarize

MB = 1e6


def _open_direct(path, flags):
    try:
        return os.open(path, flags | os.O_DIRECT, 0o600), True
    except OSError:
        return os.open(path, flags, 0o600), False


def disk_bandwidth(workdir, size_mb):
    """Sequential write then read of size_mb MiB in 1 MiB blocks. O_DIRECT
    where the filesystem allows it, so the page cache does not flatter the
    numbers; otherwise buffered with fsync (write) and the read figure is
    marked as possibly cached."""
    path = os.path.join(workdir, "physical-seq.bin")
    block = 1 << 20
    buf = mmap.mmap(-1, block)  # page aligned, as O_DIRECT needs
    buf.write(os.urandom(block))
    res = {}
    fd, direct = _open_direct(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        t0 = time.perf_counter()
        for _ in range(size_mb):
            os.write(fd, buf)
        os.fsync(fd)
        res["seq_write_mbps"] = size_mb * block / (time.perf_counter() - t0) / MB
    finally:
        os.close(fd)
    fd, direct_r = _open_direct(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        total = 0
        while True:
            n = os.readv(fd, [buf])
            if n <= 0:
                break
            total += n
        res["seq_read_mbps"] = total / (time.perf_counter() - t0) / MB
    finally:
        os.close(fd)
        os.unlink(path)
    res["direct_io"] = direct and direct_r
    res["seq_size_mb"] = size_mb
    return res


def fsync_latency(workdir, count):
    """Append 4 KiB and fsync, count times: what one durable save costs at
    least (Dovecot with mail_fsync=optimized fsyncs once per transaction)."""
    path = os.path.join(workdir, "physical-fsync.bin")
    data = os.urandom(4096)
    lat = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            os.write(fd, data)
            os.fsync(fd)
            lat.append((time.perf_counter() - t0) * 1000.0)
    finally:
        os.close(fd)
        os.unlink(path)
    lat.sort()
    return {"fsync_ms": summarize(lat),
            "fsync_p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))]}


_ZSTD_RE = re.compile(r"\(x([0-9.]+)\),\s*([0-9.]+) MB/s,\s*([0-9.]+) MB/s")


def zstd_bench(sample_path, level=3, chunk=None, seconds=1):
    """zstd -b: compress and decompress speed of the sample (MB/s of
    plaintext). chunk: compress independent chunks of that many bytes
    (-B), closer to casbox's per-blob frames than one big stream."""
    cmd = ["zstd", "-b%d" % level, "-i%d" % seconds]
    if chunk:
        cmd.append("-B%d" % chunk)
    cmd.append(sample_path)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = (res.stdout + res.stderr).replace("\r", "\n")
    matches = _ZSTD_RE.findall(out)
    if res.returncode != 0 or not matches:
        raise RuntimeError("zstd -b failed: %s" % out.strip()[-200:])
    ratio, comp, dec = matches[-1]
    return {"ratio": float(ratio), "compress_mbps": float(comp),
            "decompress_mbps": float(dec)}


_AEAD_RE = re.compile(r"^aead size=(\d+) encrypt_mbps=([0-9.]+) "
                      r"decrypt_mbps=([0-9.]+)", re.M)
# AES-256-GCM (printed only where the CPU has AES-NI)
_AES_RE = re.compile(r"^aead-aes256gcm size=(\d+) encrypt_mbps=([0-9.]+) "
                     r"decrypt_mbps=([0-9.]+)", re.M)


def _aead_parse(regex, stdout):
    return {int(size): {"encrypt_mbps": float(enc),
                        "decrypt_mbps": float(dec)}
            for size, enc, dec in regex.findall(stdout)}


def aead_bench(binary, seconds):
    """({size: {encrypt_mbps, decrypt_mbps}} of XChaCha20-Poly1305, the
    same of AES-256-GCM, {} when the CPU has no AES-NI), one run."""
    res = subprocess.run([binary, str(seconds)], capture_output=True,
                         text=True, timeout=300, check=True)
    out = _aead_parse(_AEAD_RE, res.stdout)
    if not out:
        raise RuntimeError("physical-aead printed nothing: %r" % res.stdout)
    return out, _aead_parse(_AES_RE, res.stdout)


def write_sample(paths, dest, limit_bytes):
    """Concatenate corpus messages (in the given order) into one sample
    file for zstd -b, at most limit_bytes."""
    total = 0
    with open(dest, "wb") as out:
        for p in paths:
            with open(p, "rb") as f:
                data = f.read()
            out.write(data)
            total += len(data)
            if total >= limit_bytes:
                break
    return total


def run_physical(workdir, sample_paths, aead_binary, size, repeats, log):
    """All physical figures; each bandwidth figure repeated `repeats`
    times so the report can show median and spread."""
    res = {"disk": [], "zstd": [], "zstd_chunked": [], "aead": []}
    sample = os.path.join(workdir, "zstd-sample.eml")
    res["zstd_sample_bytes"] = write_sample(sample_paths, sample,
                                            size["zstd_sample_mb"] * 1000000)
    for r in range(repeats):
        log("physical: round %d/%d" % (r + 1, repeats))
        try:
            res["disk"].append(disk_bandwidth(workdir, size["seq_mb"]))
        except OSError as e:
            res["disk_error"] = str(e)
        try:
            res["zstd"].append(zstd_bench(sample))
            res["zstd_chunked"].append(zstd_bench(sample, chunk=16384))
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            res["zstd_error"] = str(e)
        if aead_binary:
            try:
                xchacha, aes = aead_bench(aead_binary,
                                          size["aead_seconds"])
                res["aead"].append(xchacha)
                if aes:
                    res.setdefault("aead_aes", []).append(aes)
            except (OSError, RuntimeError,
                    subprocess.SubprocessError) as e:
                res["aead_error"] = str(e)
    res["fsync"] = fsync_latency(workdir, size["fsync_count"])
    os.unlink(sample)
    return res
