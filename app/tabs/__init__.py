"""The page's tabs, one module each: its components (a dataclass), its events, and what only it draws. A tab
imports `cait/` and the shared bottom of `app/`, never another tab; `app.ui` composes them."""
