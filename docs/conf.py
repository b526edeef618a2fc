"""Sphinx's settings for the docs site (`make docs`; strict, warnings as errors, in `make test`).

Sphinx because the docstrings are Sphinx-style (their :class:, :func: and :meth: roles and reST
literals render as written), autodoc reads them, sphinx-argparse reads the command line's parser, and
MyST reads the existing Markdown pages as they are. The reference pages are generated on every build by
_ext/attnlab_docs.py into _generated/ (ignored by git). Math is MathML written at build time
(latex2mathml): nothing is fetched when a page is read. Search is Sphinx's own (an index built with the
site, searched in the browser).
"""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS / "_ext"), str(DOCS.parent)]  # the extension; attnlab from this checkout

project = "attnlab"
author = "the attnlab authors"
copyright = "the attnlab authors"
release = version = __import__("attnlab").__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinxarg.ext", "attnlab_docs"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# experiments/ holds scripts and their configs; figures/ and images/ are pictures the pages show
exclude_patterns = ["experiments", "figures", "images", "_build"]

html_theme = "alabaster"
html_math_renderer = "mathml"  # _ext/attnlab_docs.py: MathML at build time, no script and no CDN
html_theme_options = {
    "description": "The Transformer family end to end",
    "fixed_sidebar": True,
    "page_width": "1200px",
    "sidebar_width": "260px",
}
html_sidebars = {"**": ["about.html", "searchbox.html", "navigation.html", "relations.html"]}
html_show_sourcelink = False
html_copy_source = False  # the Markdown sources stay in the repository; the site is HTML and its search index

myst_heading_anchors = 4  # links to a heading (page.md#a-heading) resolve, and a broken one warns
myst_enable_extensions = ["colon_fence"]
suppress_warnings = ["myst.header"]  # pages whose first heading is not level 1 (none today) stay readable

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"exclude-members": "__init__, __new__"}
