"""The page's style sheet (Gradio's theme does the rest)."""

CSS = """
/* galleries grow with their content: every computed tile is on the page, none behind a scroll bar */
.no-scroll .grid-wrap, .ca-grid .grid-wrap, #examples .grid-wrap {
    height: auto !important; min-height: 0 !important; max-height: none !important; overflow: visible !important; }
/* small inputs (a 64 px scene) are shown enlarged with crisp pixels, as the model sees them */
#image_in img, #examples img, #ca_big img { image-rendering: pixelated; }
/* captions go under their tile, never over the map, and wrap instead of being cut ("CA1 he...") when tiles
   are narrow (16 heads at 1280 px): the tile is a column of its square image and its caption */
.ca-grid .thumbnail-item, .no-scroll .thumbnail-item, #examples .thumbnail-item {
    aspect-ratio: auto !important; height: auto !important; display: flex !important; flex-direction: column;
    justify-content: flex-start; }
.ca-grid .thumbnail-item > img, .no-scroll .thumbnail-item > img, #examples .thumbnail-item > img {
    aspect-ratio: 1 / 1; height: auto !important; flex: none; }
.ca-grid .caption-label, .no-scroll .caption-label, #examples .caption-label {
    position: static !important; white-space: normal !important; overflow: visible !important;
    text-overflow: clip !important; max-width: 100% !important; border: none !important; border-radius: 0 !important;
    opacity: 1 !important; line-height: 1.25; }
/* saliency tiles at most a quarter of the page wide, however few are ticked (one was 1196 px) */
#sal_gallery .grid-container { grid-template-columns: repeat(4, minmax(0, 1fr)) !important; }
#image_in img { width: 100%; height: 100%; object-fit: contain; }
/* a gallery's label sits above its first row of tiles, not on it */
#examples .grid-wrap, .ca-grid .grid-wrap, .no-scroll .grid-wrap { padding-top: 1.8rem !important; }
.top5 { font-size: 0.95rem; }
.top5-title { font-weight: 600; margin-bottom: 0.4rem; }
.top5-row { display: grid; grid-template-columns: 14rem 1fr 4.5rem; align-items: center; gap: 0.6rem;
            margin: 0.25rem 0; }
.top5-label { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.top5-track { background: var(--neutral-100); height: 0.7rem; border-radius: 0.35rem; overflow: hidden; }
.top5-bar { display: block; height: 100%; background: var(--color-accent); }
.top5-value { text-align: right; font-variant-numeric: tabular-nums; }
.causal-top5 td, .causal-top5 th { padding: 0.15rem 0.5rem; font-variant-numeric: tabular-nums; }
/* the model card's key column keeps its words whole beside a long value (it was crushed letter by letter) */
#card_md table td:first-child { min-width: 11rem; word-break: normal; overflow-wrap: normal; }
#card_md table td:last-child { overflow-wrap: anywhere; }
/* a checked radio under the mouse keeps its fill and border. Gradio's `input:hover:not([disabled])` comes after
   its `input:checked:hover` and is as specific, so once a clicked radio lost focus (Tab, a key on another control)
   with the mouse still on it, it was drawn white and borderless, as if unchecked */
input[type=radio]:checked:hover:not([disabled]) {
    border-color: var(--checkbox-border-color-selected); background-color: var(--checkbox-background-color-selected); }
"""
