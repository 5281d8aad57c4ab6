"""Base class for every config section: unknown keys are errors (a typo must not pass silently).

Secret fields (`json_schema_extra={"secret": True}`) have a `<name>_file` twin; read them with
`section.secret(name)` (shared/runtime/credentials.py)."""

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, model_validator


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())
    SECTION: ClassVar[str] = ""  # dotted name used in error messages ("controller", "weights", ...)

    @model_validator(mode="after")
    def _no_redacted_secrets(self):
        from shared.runtime.credentials import REDACTED, secret_fields

        for name in secret_fields(type(self)):
            if getattr(self, name) == REDACTED:
                raise ValueError(f"{self._label(name)}: {REDACTED!r} is the placeholder of a redacted dump, not a "
                                 f"secret: set the real value, or {name}_file")
            if getattr(self, name) and getattr(self, f"{name}_file", ""):
                raise ValueError(f"{self._label(name)}: set {name} or {name}_file, not both")
        return self

    def _label(self, name: str) -> str:
        return f"{self.SECTION}.{name}" if self.SECTION else name

    def secret(self, name: str) -> str:
        """The secret `name`: its inline value, or the content of the file `<name>_file` names ('' if
        neither is set). Raises SecretFileError naming the field when the file cannot be read."""
        from shared.runtime.credentials import read_secret

        path = getattr(self, f"{name}_file", "")
        if path:
            return read_secret(path, self._label(f"{name}_file"))
        return getattr(self, name)
