"""Console operators: accounts (argon2id password hashes, roles owner / operator / viewer)
and their sign-in sessions (a random cookie token, stored only as its sha256, with a CSRF
token and an idle expiry)."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from loraplex.platform.db.models import OPERATOR_ROLES, ConsoleSession, Operator

from . import audit
from .errors import Conflict, InvalidInput

MIN_PASSWORD = 12
MAX_PASSWORD = 1024
MAX_EMAIL = 254
# Roles that may change things; `viewer` only reads.
WRITE_ROLES = frozenset({"owner", "operator"})
_HASHER = PasswordHasher()  # argon2id with the library's (RFC 9106 low-memory) parameters
# Verified against when the email is unknown, so a miss costs as long as a wrong password.
_DUMMY_HASH = _HASHER.hash(secrets.token_urlsafe(16))


@dataclass(frozen=True)
class SignedIn:
    """A live console session: who, with what role, and the token that guards its forms."""

    operator_id: uuid.UUID
    email: str
    role: str
    csrf_token: str

    @property
    def can_write(self) -> bool:
        """True for roles that may change things."""
        return self.role in WRITE_ROLES

    @property
    def actor(self) -> str:
        """The audit-log actor string for this operator."""
        return operator_actor(self.email)


def operator_actor(email: str) -> str:
    """The audit-log actor for a console operator."""
    return f"operator:{email}"


def normalize_email(email: str) -> str:
    """Trimmed and lower-cased; InvalidInput unless it looks like an address."""
    value = (email or "").strip().lower()
    local, at, domain = value.partition("@")
    if not at or not local or "." not in domain or len(value) > MAX_EMAIL or " " in value:
        raise InvalidInput("enter a valid email address", code="invalid_email", param="email")
    return value


def check_password(password: str) -> str:
    """InvalidInput unless the password is 12 to 1024 characters."""
    if not MIN_PASSWORD <= len(password or "") <= MAX_PASSWORD:
        raise InvalidInput(
            f"the password must be {MIN_PASSWORD} to {MAX_PASSWORD} characters",
            code="invalid_password",
            param="password",
        )
    return password


def create_operator(
    session: Session,
    email: str,
    password: str,
    role: str,
    *,
    actor: str = audit.ADMIN_ACTOR,
    operator_id: uuid.UUID | None = None,
) -> Operator:
    """Create an operator (Conflict if the email is taken); the password is stored hashed."""
    if role not in OPERATOR_ROLES:
        raise InvalidInput(
            f"role must be one of {list(OPERATOR_ROLES)}", code="invalid_role", param="role"
        )
    address = normalize_email(email)
    digest = _HASHER.hash(check_password(password))
    stmt = (
        insert(Operator)
        .values(id=uuid.uuid4(), email=address, password_hash=digest, role=role)
        .on_conflict_do_nothing()
        .returning(Operator.id)
    )
    new_id = session.execute(stmt).scalar_one_or_none()
    if new_id is None:
        raise Conflict(f"an operator {address!r} exists already", code="operator_exists")
    audit.record(
        session,
        actor=actor,
        operator_id=operator_id,
        action="operator.create",
        resource_type="operator",
        resource_id=new_id,
        detail={"email": address, "role": role},
    )
    op = session.get(Operator, new_id)
    assert op is not None
    return op


def count_operators(session: Session) -> int:
    """How many operators exist (none: the admin key may create the first owner)."""
    return int(session.scalar(select(func.count()).select_from(Operator)) or 0)


def list_operators(session: Session) -> list[Operator]:
    """Every operator, by email."""
    return list(session.scalars(select(Operator).order_by(Operator.email)))


def authenticate(session: Session, email: str, password: str) -> Operator | None:
    """The enabled operator with this email and password, or None (same cost either way)."""
    try:
        address = normalize_email(email)
    except InvalidInput:
        address = ""
    op = session.scalars(select(Operator).where(Operator.email == address)).one_or_none()
    digest = op.password_hash if op is not None else _DUMMY_HASH
    try:
        _HASHER.verify(digest, password or "")
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return None
    if op is None or op.disabled_at is not None:
        return None
    if _HASHER.check_needs_rehash(op.password_hash):
        op.password_hash = _HASHER.hash(password)
    op.last_login_at = datetime.now(UTC)
    return op


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def start_session(session: Session, op: Operator) -> str:
    """A new session for `op`; returns the cookie token (only its hash is stored)."""
    token = secrets.token_urlsafe(32)
    session.add(
        ConsoleSession(
            token_hash=_token_hash(token),
            operator_id=op.id,
            csrf_token=secrets.token_urlsafe(32),
            last_seen_at=datetime.now(UTC),
        )
    )
    return token


def resume_session(session: Session, token: str, idle: timedelta) -> SignedIn | None:
    """The session for a cookie token, refreshed; None when unknown, idle too long (it is
    then removed) or its operator is disabled."""
    if not token or len(token) > 128:
        return None
    row = session.get(ConsoleSession, _token_hash(token))
    if row is None:
        return None
    now = datetime.now(UTC)
    if now - row.last_seen_at > idle or row.operator.disabled_at is not None:
        session.delete(row)
        return None
    if now - row.last_seen_at > timedelta(seconds=15):  # do not write on every poll
        row.last_seen_at = now
    return SignedIn(row.operator_id, row.operator.email, row.operator.role, row.csrf_token)


def end_session(session: Session, token: str) -> None:
    """Sign out: the session's row is removed, so its cookie is worthless from now on."""
    session.execute(delete(ConsoleSession).where(ConsoleSession.token_hash == _token_hash(token)))
