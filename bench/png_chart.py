"""A grouped bar chart written as a PNG with the standard library only (zlib + struct), so the
benchmark needs no matplotlib. Text uses a built-in 5x7 pixel font (upper-case, digits, a few
signs; lower-case input is drawn upper-case).

    write_bar_chart("chart.png", title, groups=["TINY 1R FP32", ...],
                    series={"ALPACA-TRAIN": [...], "PYTORCH FSDP": [...]}, y_label="TOKENS/S")
"""
import struct
import zlib

_FONT = {  # 5 columns x 7 rows, '#' = ink
    "A": "01110 10001 10001 11111 10001 10001 10001", "B": "11110 10001 10001 11110 10001 10001 11110",
    "C": "01110 10001 10000 10000 10000 10001 01110", "D": "11110 10001 10001 10001 10001 10001 11110",
    "E": "11111 10000 10000 11110 10000 10000 11111", "F": "11111 10000 10000 11110 10000 10000 10000",
    "G": "01110 10001 10000 10111 10001 10001 01111", "H": "10001 10001 10001 11111 10001 10001 10001",
    "I": "01110 00100 00100 00100 00100 00100 01110", "J": "00111 00010 00010 00010 00010 10010 01100",
    "K": "10001 10010 10100 11000 10100 10010 10001", "L": "10000 10000 10000 10000 10000 10000 11111",
    "M": "10001 11011 10101 10101 10001 10001 10001", "N": "10001 10001 11001 10101 10011 10001 10001",
    "O": "01110 10001 10001 10001 10001 10001 01110", "P": "11110 10001 10001 11110 10000 10000 10000",
    "Q": "01110 10001 10001 10001 10101 10010 01101", "R": "11110 10001 10001 11110 10100 10010 10001",
    "S": "01111 10000 10000 01110 00001 00001 11110", "T": "11111 00100 00100 00100 00100 00100 00100",
    "U": "10001 10001 10001 10001 10001 10001 01110", "V": "10001 10001 10001 10001 10001 01010 00100",
    "W": "10001 10001 10001 10101 10101 10101 01010", "X": "10001 10001 01010 00100 01010 10001 10001",
    "Y": "10001 10001 01010 00100 00100 00100 00100", "Z": "11111 00001 00010 00100 01000 10000 11111",
    "0": "01110 10001 10011 10101 11001 10001 01110", "1": "00100 01100 00100 00100 00100 00100 01110",
    "2": "01110 10001 00001 00010 00100 01000 11111", "3": "11111 00010 00100 00010 00001 10001 01110",
    "4": "00010 00110 01010 10010 11111 00010 00010", "5": "11111 10000 11110 00001 00001 10001 01110",
    "6": "00110 01000 10000 11110 10001 10001 01110", "7": "11111 00001 00010 00100 01000 01000 01000",
    "8": "01110 10001 10001 01110 10001 10001 01110", "9": "01110 10001 10001 01111 00001 00010 01100",
    ".": "00000 00000 00000 00000 00000 01100 01100", "-": "00000 00000 00000 11111 00000 00000 00000",
    "/": "00001 00010 00010 00100 01000 01000 10000", ":": "00000 01100 01100 00000 01100 01100 00000",
    "(": "00010 00100 01000 01000 01000 00100 00010", ")": "01000 00100 00010 00010 00010 00100 01000",
    "%": "11001 11010 00010 00100 01000 01011 10011", "=": "00000 00000 11111 00000 11111 00000 00000",
    "_": "00000 00000 00000 00000 00000 00000 11111", " ": "00000 00000 00000 00000 00000 00000 00000",
    ",": "00000 00000 00000 00000 01100 00100 01000",
}
_PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]


class _Canvas:
    def __init__(self, w: int, h: int):
        self.w, self.h = w, h
        self.px = bytearray(b"\xff" * (w * h * 3))

    def rect(self, x0, y0, x1, y1, rgb):
        for y in range(max(0, y0), min(self.h, y1)):
            row = y * self.w * 3
            for x in range(max(0, x0), min(self.w, x1)):
                self.px[row + 3 * x:row + 3 * x + 3] = bytes(rgb)

    def text(self, x, y, s, rgb=(0, 0, 0), scale=1):
        for ch in str(s).upper():
            glyph = _FONT.get(ch, _FONT[" "])
            for r, bits in enumerate(glyph.split()):
                for c, b in enumerate(bits):
                    if b == "1":
                        self.rect(x + c * scale, y + r * scale, x + (c + 1) * scale, y + (r + 1) * scale, rgb)
            x += 6 * scale

    def save(self, path):
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3]) for y in range(self.h))

        def chunk(tag, data):
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n")
            f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)))
            f.write(chunk(b"IDAT", zlib.compress(raw, 9)))
            f.write(chunk(b"IEND", b""))


def text_width(s: str, scale: int = 1) -> int:
    return 6 * scale * len(s)


def write_bar_chart(path, title, groups, series, y_label=""):
    """groups: names along x; series: {name: [value or None per group]}."""
    names = list(series)
    bar_w, gap = 14, 18
    group_w = bar_w * len(names) + gap
    left, top, bottom = 70, 40, 110
    w = max(left + group_w * len(groups) + 20, left + text_width(title, 2) + 20, 420)
    h = 360
    c = _Canvas(w, h)
    c.text(left, 10, title, scale=2)
    vmax = max([v for vals in series.values() for v in vals if v is not None] + [1e-12])
    plot_h = h - top - bottom
    c.rect(left - 1, top, left, top + plot_h + 1, (0, 0, 0))
    c.rect(left - 1, top + plot_h, w - 10, top + plot_h + 1, (0, 0, 0))
    for frac in (0.0, 0.5, 1.0):
        y = top + plot_h - int(frac * plot_h)
        c.rect(left - 4, y, left, y + 1, (0, 0, 0))
        c.text(2, y - 3, _fmt(vmax * frac))
    if y_label:
        c.text(2, top - 14, y_label)
    for gi, g in enumerate(groups):
        x0 = left + 10 + gi * group_w
        for si, name in enumerate(names):
            v = series[name][gi]
            if v is None:
                continue
            bh = int(plot_h * v / vmax)
            c.rect(x0 + si * bar_w, top + plot_h - bh, x0 + (si + 1) * bar_w - 2, top + plot_h, _PALETTE[si % 4])
        # group label, written vertically as stacked words to fit narrow groups
        for li, word in enumerate(str(g).split()):
            c.text(x0, top + plot_h + 6 + li * 10, word)
    ly = h - 22
    lx = left
    for si, name in enumerate(names):
        c.rect(lx, ly, lx + 10, ly + 8, _PALETTE[si % 4])
        c.text(lx + 14, ly, name)
        lx += 14 + text_width(name) + 20
    c.save(path)


def _fmt(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:.1f}M"
    if v >= 1e3:
        return f"{v / 1e3:.1f}K"
    return f"{v:.2f}" if v < 10 else f"{v:.0f}"
