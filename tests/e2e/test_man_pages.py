"""The doveadm-casbox man pages: one per command group of doc/doveadm.md
(what make install installs), rendering without groff warnings, and
carrying what the reference says: its synopsis and every option it
names. No Dovecot needed."""

import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dovecot_harness import TOP_BUILDDIR, TOP_SRCDIR  # noqa: E402

REFERENCE = os.path.join(TOP_SRCDIR, "doc", "doveadm.md")
GENERATOR = os.path.join(TOP_SRCDIR, "scripts", "doveadm-man")
MANDIR = os.path.join(TOP_BUILDDIR, "man")


def reference_groups():
    """group -> its sections' text, read from the reference directly
    (not through the generator)."""
    groups = {}
    current = None
    fence = False
    with open(REFERENCE) as f:
        for line in f:
            if line.startswith("```"):
                fence = not fence
            if not fence and line.startswith("## "):
                m = re.match(r"## doveadm casbox ([a-z][a-z0-9-]*)", line)
                current = m.group(1) if m else None
                if current:
                    groups.setdefault(current, [])
                continue
            if current:
                groups[current].append(line)
    return groups


def built_pages():
    return sorted(n for n in os.listdir(MANDIR) if n.endswith(".1"))


def render(page):
    res = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", "-rLL=200n", "-P-cbou",
         os.path.join(MANDIR, page)],
        capture_output=True, text=True,
        env=dict(os.environ, LC_ALL="C.UTF-8"))
    return res


def plain(text):
    return " ".join(text.replace("\u2010", "-").split())


class ManPagesTest(unittest.TestCase):

    def test_every_group_has_a_page(self):
        want = sorted(["doveadm-casbox.1"] +
                      ["doveadm-casbox-%s.1" % g for g in reference_groups()])
        # what make install installs, and what the build made
        listed = subprocess.run([sys.executable, GENERATOR, "--list",
                                 REFERENCE], capture_output=True, text=True,
                                check=True).stdout.split()
        self.assertEqual(sorted(listed), want)
        self.assertEqual(built_pages(), want)

    def test_every_section_has_a_name_line(self):
        """The NAME line (`doveadm casbox X` - what it does) the page's
        NAME and the overview's list come from."""
        text = open(REFERENCE).read()
        for m in re.finditer(r"(?m)^## (doveadm casbox [a-z].*)$", text):
            rest = text[m.end():].split("\n## ", 1)[0]
            name = re.search(r"### NAME\n(.+(?:\n.+)*)", rest)
            self.assertIsNotNone(name, m.group(1))
            self.assertIn(" - ", name.group(1), m.group(1))

    def test_pages_render_cleanly(self):
        for page in built_pages():
            res = render(page)
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertEqual(res.stderr, "", page)
            for head in ("NAME", "SYNOPSIS", "DESCRIPTION", "SEE ALSO"):
                self.assertRegex(res.stdout, r"(?m)^%s$" % head, page)

    def test_pages_carry_the_reference(self):
        for group, lines in reference_groups().items():
            page = "doveadm-casbox-%s.1" % group
            out = plain(render(page).stdout)
            text = "".join(lines)
            # every synopsis line, word for word
            syn = re.findall(r"### SYNOPSIS\n((?:.+\n)+)", text)
            self.assertTrue(syn, group)
            for block in syn:
                for line in block.strip().split("\n"):
                    self.assertIn(plain(line.replace("`", "")), out,
                                  "%s: synopsis" % page)
            # a mail command's page lists doveadm's user selection
            if "-u user" in "".join(syn):
                options = out.split(" OPTIONS ", 1)[1]
                for opt in ("-A", "-F file", "-S socket_path",
                            "-u user/mask"):
                    self.assertIn(" %s " % opt, options, page)
            # every long option the reference names
            for opt in sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z-]+",
                                             text))):
                self.assertIn(opt, out, "%s: %s" % (page, opt))
        # the footer names the version configure.ac gives
        with open(os.path.join(TOP_SRCDIR, "configure.ac")) as f:
            version = re.search(r"^AC_INIT\(\[casbox\], \[([^]]+)\]",
                                f.read(), re.M).group(1)
        with open(os.path.join(MANDIR, "doveadm-casbox-scrub.1")) as f:
            self.assertRegex(f.read(), r'(?m)^\.TH .* "casbox %s" "casbox"$'
                             % re.escape(version))
        # the overview lists every group's page
        out = plain(render("doveadm-casbox.1").stdout)
        for group in reference_groups():
            self.assertIn("doveadm-casbox-%s(1)" % group, out)

    def test_generator_warns_on_a_section_without_name(self):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".md") as f:
            f.write("# t\n\n## doveadm casbox frob\n\nno NAME here\n")
            f.flush()
            with tempfile.TemporaryDirectory() as d:
                res = subprocess.run([sys.executable, GENERATOR, "-o", d,
                                      f.name], capture_output=True,
                                     text=True)
                # the build goes on; test_every_section_has_a_name_line
                # is what fails
                self.assertEqual(res.returncode, 0, res.stderr)
                self.assertIn("warning: section 'doveadm casbox frob'",
                              res.stderr)
                self.assertEqual(sorted(os.listdir(d)),
                                 ["doveadm-casbox-frob.1",
                                  "doveadm-casbox.1"])

    def test_generator_handles_the_aecs_style(self):
        """A NAME without code span, a synopsis wrapped over lines (as
        the aecs branch writes them)."""
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".md") as f:
            f.write("# t\n\n## doveadm casbox frob export\n\n### NAME\n"
                    "doveadm casbox frob export - write it\nout\n\n"
                    "### SYNOPSIS\n`doveadm casbox frob export [-u user]\n"
                    "(--db FILE | --sql FILE)`\n\n### OPTIONS\n"
                    "`--db FILE`\n")
            f.flush()
            with tempfile.TemporaryDirectory() as d:
                subprocess.run([sys.executable, GENERATOR, "-o", d, f.name],
                               check=True, capture_output=True)
                with open(os.path.join(d, "doveadm-casbox-frob.1")) as p:
                    page = p.read()
        self.assertIn("doveadm\\-casbox\\-frob \\- write it out\n", page)
        self.assertIn("\\fBdoveadm casbox frob export [\\-u user] "
                      "(\\-\\-db FILE | \\-\\-sql FILE)\\fR\n", page)
        self.assertIn("User selection", page)

if __name__ == "__main__":
    unittest.main()
