"""Text that fits a figure one column of a paper wide (figures.WIDTH): a legend laid out, a title wrapped, until
every artist lies within the figure as it is drawn; nothing is cut at the column's edges."""

import textwrap

LEGEND_ROW = 0.17  # inches a legend row adds below a metric figure's axes (7-point text)


def legend_below(fig, ax) -> None:
    """The axes' entries in a legend below them, laid out to fit the figure's width (a paper's column): two entries a
    row where they fit, else one, else each label wrapped onto lines of its own; the figure grows by its rows."""
    handles, labels = ax.get_legend_handles_labels()
    base = fig.get_size_inches()[1]
    for columns, width in ((2, None), (1, None), (1, 40), (1, 30), (1, 22)):
        for legend in fig.legends[:]:
            legend.remove()
        texts = [textwrap.fill(label, width) if width else label for label in labels]
        lines = sum(max(text.count("\n") + 1 for text in texts[i:i + columns]) for i in range(0, len(texts), columns))
        fig.set_size_inches(fig.get_size_inches()[0], base + LEGEND_ROW * lines)
        legend = fig.legend(handles, texts, loc="outside lower center", ncol=columns, frameon=False, handlelength=2.5)
        if legend.get_window_extent(fig.canvas.get_renderer()).width <= fig.bbox.width - 1:  # centred on the figure
            return


def inside(fig, *artists) -> bool:
    """Whether every artist, as the figure draws now, lies within the figure (nothing cut at its edges)."""
    fig.canvas.draw()
    renderer, box = fig.canvas.get_renderer(), fig.bbox
    extents = [artist.get_window_extent(renderer) for artist in artists]
    return all(box.x0 - 0.5 <= e.x0 and e.x1 <= box.x1 + 0.5 and box.y0 - 0.5 <= e.y0 and e.y1 <= box.y1 + 0.5
               for e in extents)


TITLE_SHARE = 0.8  # of the figure's width a title may take before it is laid out: its axes sit right of centre


def fitted_title(fig, ax, title: str) -> str:
    """The title as it fits the figure's width: whole, else wrapped at word boundaries; a try whose text alone is
    wider than TITLE_SHARE of the figure is not laid out (each layout and drawing costs a quarter second), the others
    are, and checked drawn. Returns the text set."""
    for width in (None, 56, 46, 38, 30):
        text = "\n".join(textwrap.fill(line, width) if width else line for line in title.split("\n"))
        ax.set_title(text)
        if ax.title.get_window_extent(fig.canvas.get_renderer()).width > TITLE_SHARE * fig.bbox.width:
            continue
        fig.tight_layout()
        if inside(fig, ax.title):
            return text
    fig.tight_layout()
    return text
