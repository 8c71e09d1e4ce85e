"""The demo's learning curve as a PNG (matplotlib, from the ``reef-core[demo]`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

INSTALL_HINT = ("reef demo draws its learning curve with matplotlib: "
                "pip install 'reef-core[demo]' (scripts/setup.sh installs it)")


def matplotlib_missing() -> str | None:
    """Why the curve cannot be drawn (with how to fix it), or None when it can."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return INSTALL_HINT
    return None


def draw_curve(result: Any) -> Any:
    """The learning curve's matplotlib figure: each round's mean score of the users' answers
    against the reports sent so far; a vertical line and a label at each release published
    (``result.releases``: the reports sent when it was seen published); the held-out score
    before (at 0) and after (past the last report)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p["reports"] for p in result.curve]
    ys = [p["score"] for p in result.curve]
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=120)
    ax.plot(xs, ys, marker="o", color="#1f77b4", label="users' score per round (traffic)")
    for i, release in enumerate(result.releases, start=1):
        ax.axvline(release["reports"], color="#2ca02c", linestyle="--", linewidth=1.2, gid=f"release-{i}")
        # labels of releases published close together step down instead of overlapping
        ax.annotate(f"release {i} published", (release["reports"], 1.08 - 0.07 * ((i - 1) % 3)), fontsize=8,
                    color="#2ca02c", ha="center", gid=f"release-{i}-label")
    end = (xs[-1] if xs else 0) + 1
    ax.plot([0], [result.before], marker="s", markersize=9, linestyle="none", color="#d62728",
            label=f"held-out, before learning: {result.before:.2f}")
    ax.plot([end], [result.after], marker="s", markersize=9, linestyle="none", color="#2ca02c",
            label=f"held-out, after learning: {result.after:.2f}")
    ax.set_xlim(-0.5, end + 0.5)
    ax.set_ylim(-0.05, 1.12)
    ax.set_xlabel("reports sent")
    ax.set_ylabel("mean score (1 = the preference is met)")
    ax.set_title(f"reef demo: {result.recipe} learns \u201c{result.preference}\u201d", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def learning_curve(result: Any, path: Path) -> Path:
    """``draw_curve``'s figure, saved as a PNG at ``path``."""
    fig = draw_curve(result)
    import matplotlib.pyplot as plt  # after draw_curve chose the Agg backend

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
