"""``python -m reef_recipe_tttd``: the ``reef tttd`` commands under the package's name."""

from .cli import main

main()
