"""The token view: one sample as the model sees it, token by token, trained tokens coloured.

Shows the tokens that `engine.encode_samples` made from a sample (the chat template applied)
as coloured spans in a read-only text box: tokens the model learns to produce on one colour,
tokens it only reads (prompt, template) on another, with alternating shades so that each token
boundary shows, control tokens in bold, newlines drawn as "↵". Hovering a token tells its id.
The colours follow the palette, so the view reads in light and dark themes.

What this module is not: it encodes nothing itself (the samples model hands it an `Encoded`).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

from PySide6.QtCore import QEvent, QObject
from PySide6.QtGui import QColor, QFont, QHelpEvent, QPalette, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QHBoxLayout, QLabel, QTextEdit, QToolTip, QVBoxLayout, QWidget

from engine import Encoded, Tokenizer

from ...widgets.theme import is_dark

TOKEN_PROPERTY = QTextCharFormat.UserProperty + 1  # the token's index, on each span


@dataclass(frozen=True)
class TokenSpan:
    """One token as shown: its id, its text (bytes decoded as UTF-8 across tokens), flags."""

    token_id: int
    text: str  # "" for a byte token that only starts a character (the next token completes it)
    trained: bool
    special: bool


def token_spans(tokenizer: Tokenizer, encoded: Encoded) -> list[TokenSpan]:
    """The tokens of `encoded` with their text; joined, the texts give the decoded sample."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    spans: list[TokenSpan] = []
    for token_id, trained in zip(encoded.tokens.tolist(), encoded.trained.tolist(), strict=True):
        text = decoder.decode(tokenizer.token_bytes(token_id))
        spans.append(TokenSpan(int(token_id), text, bool(trained), tokenizer.is_control(token_id)))
    rest = decoder.decode(b"", final=True)
    if rest and spans:
        last = spans[-1]
        spans[-1] = TokenSpan(last.token_id, last.text + rest, last.trained, last.special)
    return spans


def token_colours(palette: QPalette) -> dict[str, tuple[QColor, QColor] | QColor]:
    """Backgrounds (two shades each) for trained and masked tokens, and the special-token colour."""
    if is_dark(palette):
        return {
            "trained": (QColor("#1e5631"), QColor("#2b7343")),
            "masked": (QColor("#3b3f46"), QColor("#4b5059")),
            "special": QColor("#e0b0ff"),
        }
    return {
        "trained": (QColor("#bfeabf"), QColor("#97d897")),
        "masked": (QColor("#e6e6e6"), QColor("#d0d0d0")),
        "special": QColor("#7d3c98"),
    }


def display_text(text: str) -> str:
    """What a token shows: newlines as "↵" then the line break, tabs as "→", an empty token as "·"."""
    if not text:
        return "·"
    return text.replace("\t", "→\t").replace("\n", "↵\n")


class TokenViewWidget(QWidget):
    """The selected sample's tokens, with a legend and the trained / masked counts."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.tokens: list[TokenSpan] = []
        self._tokenizer: Tokenizer | None = None
        self._encoded: Encoded | None = None
        self._note = ""

        self.title = QLabel("<b>Tokens</b>")
        self.legend = QLabel()
        self.legend.setToolTip(
            "Green tokens are the ones the model learns to produce (assistant replies and their "
            "end-of-turn token); grey ones it only reads (system and user turns, the chat template). "
            "Shades alternate so each token's boundaries show; control tokens are bold."
        )
        self.legend.setWordWrap(True)  # wraps rather than widening the page (a 1024-pixel window)
        self.counts = QLabel()
        self.counts.setToolTip("Tokens of this sample after the chat template, split by trained / masked")
        self.text = QTextEdit()
        self.text.setReadOnly(True)
        self.text.setUndoRedoEnabled(False)
        self.text.setToolTip("")
        self.text.viewport().installEventFilter(self)
        font = QFont("monospace")
        font.setStyleHint(QFont.Monospace)
        self.text.setFont(font)

        top = QHBoxLayout()
        top.addWidget(self.title)
        top.addSpacing(12)
        top.addWidget(self.legend, 1)  # takes the width there is, wrapping only when there is too little
        top.addWidget(self.counts)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.text, 1)
        self._update_legend()
        self.show_message("Select a sample to see its tokens.")

    # --- content ------------------------------------------------------------------------------
    @property
    def n_trained(self) -> int:
        return sum(1 for t in self.tokens if t.trained)

    @property
    def n_masked(self) -> int:
        return sum(1 for t in self.tokens if not t.trained)

    def show_message(self, message: str) -> None:
        """No tokens: say why (no model, no sample, the sample cannot be encoded)."""
        self.tokens, self._tokenizer, self._encoded = [], None, None
        self.counts.setText("")
        self.text.setPlainText(message)

    def show_tokens(self, tokenizer: Tokenizer, encoded: Encoded, note: str = "") -> None:
        """Render `encoded` (one sample's tokens and trained mask); `note` goes after the counts."""
        self._tokenizer, self._encoded, self._note = tokenizer, encoded, note
        self.tokens = token_spans(tokenizer, encoded)
        self._render()

    def _render(self) -> None:
        colours = token_colours(self.palette())
        trained_bg, masked_bg = colours["trained"], colours["masked"]
        special_fg = colours["special"]
        assert (
            isinstance(trained_bg, tuple) and isinstance(masked_bg, tuple) and isinstance(special_fg, QColor)
        )
        text_fg = self.palette().color(QPalette.Text)
        dim_fg = self.palette().color(QPalette.PlaceholderText)
        doc = self.text.document()
        doc.clear()
        cursor = QTextCursor(doc)
        cursor.beginEditBlock()
        shade = {True: 0, False: 0}
        for i, t in enumerate(self.tokens):
            fmt = QTextCharFormat()
            shades = trained_bg if t.trained else masked_bg
            fmt.setBackground(shades[shade[t.trained] % 2])
            shade[t.trained] += 1
            fmt.setForeground(special_fg if t.special else text_fg if t.text else dim_fg)
            if t.special:
                fmt.setFontWeight(QFont.Bold)
            fmt.setProperty(TOKEN_PROPERTY, i)
            cursor.insertText(display_text(t.text), fmt)
        cursor.endEditBlock()
        self.text.moveCursor(QTextCursor.Start)
        trained, masked = self.n_trained, self.n_masked
        note = f" · {self._note}" if self._note else ""
        self.counts.setText(f"{trained} trained / {masked} masked tokens{note}")

    def _update_legend(self) -> None:
        colours = token_colours(self.palette())
        trained, masked, special = colours["trained"], colours["masked"], colours["special"]
        assert isinstance(trained, tuple) and isinstance(masked, tuple) and isinstance(special, QColor)
        fg = self.palette().color(QPalette.Text).name()

        def chip(bg: QColor, label: str) -> str:
            return f'<span style="background:{bg.name()}; color:{fg};">&nbsp;{label}&nbsp;</span>'

        self.legend.setText(
            f"{chip(trained[0], 'trained')}{chip(trained[1], 'tokens')} &nbsp; "
            f"{chip(masked[0], 'masked')}{chip(masked[1], '(prompt, template)')} &nbsp; "
            f'<b style="color:{special.name()};">control token</b> &nbsp; ↵ newline'
        )

    # --- palette and tooltips -----------------------------------------------------------------
    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt override
        if event.type() == QEvent.PaletteChange:
            self._update_legend()
            if self.tokens:
                self._render()
        super().changeEvent(event)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if watched is self.text.viewport() and event.type() == QEvent.ToolTip and self.tokens:
            assert isinstance(event, QHelpEvent)
            cursor = self.text.cursorForPosition(event.pos())
            # the format at a cursor is that of the character before it: look one to the right
            if not cursor.atBlockEnd():
                cursor.movePosition(QTextCursor.NextCharacter)
            index = cursor.charFormat().property(TOKEN_PROPERTY)
            if isinstance(index, int) and 0 <= index < len(self.tokens):
                t = self.tokens[index]
                kind = "trained" if t.trained else "masked"
                special = ", control token" if t.special else ""
                QToolTip.showText(
                    event.globalPos(),
                    f"token {index}: id {t.token_id} {t.text!r} ({kind}{special})",
                    self.text,
                )
                return True
        return super().eventFilter(watched, event)


__all__ = ["TokenSpan", "TokenViewWidget", "display_text", "token_spans"]
