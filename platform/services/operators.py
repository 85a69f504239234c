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
from .errors import Conflict, InvalidInput, NotFound

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


INVITE_TTL = timedelta(days=7)


def _one_time_link(op: Operator) -> str:
    """Give `op` a fresh one-time set-password token (returned; only its hash is kept) and
    make the current password unusable."""
    token = secrets.token_urlsafe(32)
    op.invite_token_hash = _token_hash(token)
    op.invite_expires_at = datetime.now(UTC) + INVITE_TTL
    op.password_hash = _HASHER.hash(secrets.token_urlsafe(32))
    return token


def _get(session: Session, operator_id: uuid.UUID, *, lock: bool = False) -> Operator:
    stmt = select(Operator).where(Operator.id == operator_id)
    op = session.scalars(stmt.with_for_update() if lock else stmt).one_or_none()
    if op is None:
        raise NotFound(f"no operator with id {operator_id}", code="operator_not_found")
    return op


def _record(session: Session, actor: str, by: uuid.UUID | None, action: str, op: Operator,
            **detail: object) -> None:  # fmt: skip
    audit.record(session, actor=actor, operator_id=by, action=action, resource_type="operator",
                 resource_id=op.id, detail={"email": op.email, **detail})  # fmt: skip


def invite_operator(
    session: Session, email: str, role: str, *, actor: str, operator_id: uuid.UUID | None = None
) -> tuple[Operator, str]:
    """A new operator who sets a password through a one-time link (valid 7 days); returns
    the operator and the link's token."""
    op = create_operator(session, email, secrets.token_urlsafe(32), role, actor=actor,
                         operator_id=operator_id)  # fmt: skip
    token = _one_time_link(op)
    _record(session, actor, operator_id, "operator.invite", op, role=role)
    return op, token


def _enabled_owners(session: Session) -> list[Operator]:
    """The enabled owners, locked until the transaction ends (two changes cannot both think
    another owner remains)."""
    stmt = select(Operator).where(Operator.role == "owner", Operator.disabled_at.is_(None))
    return list(session.scalars(stmt.order_by(Operator.id).with_for_update()))


def _keep_an_owner(session: Session, op: Operator) -> None:
    owners = _enabled_owners(session)
    if op.role == "owner" and op.disabled_at is None and [o.id for o in owners] == [op.id]:
        raise Conflict(
            f"{op.email} is the last owner: make another operator owner first",
            code="last_owner",
        )


def change_role(
    session: Session,
    target: uuid.UUID,
    role: str,
    *,
    actor: str,
    operator_id: uuid.UUID | None = None,
) -> Operator:
    """Give an operator another role (never the last owner's away)."""
    if role not in OPERATOR_ROLES:
        raise InvalidInput(
            f"role must be one of {list(OPERATOR_ROLES)}", code="invalid_role", param="role"
        )
    op = _get(session, target, lock=True)
    if role != "owner":
        _keep_an_owner(session, op)
    before, op.role = op.role, role
    _record(session, actor, operator_id, "operator.role", op, before=before, role=role)
    return op


def set_disabled(
    session: Session,
    target: uuid.UUID,
    disabled: bool,
    *,
    actor: str,
    operator_id: uuid.UUID | None = None,
) -> Operator:
    """Disable an operator (their sessions end at once; never the last owner) or enable."""
    op = _get(session, target, lock=True)
    if disabled:
        _keep_an_owner(session, op)
        op.disabled_at = op.disabled_at or datetime.now(UTC)
        session.execute(delete(ConsoleSession).where(ConsoleSession.operator_id == op.id))
    else:
        op.disabled_at = None
    _record(session, actor, operator_id, "operator.disable" if disabled else "operator.enable", op)
    return op


def reset_password(
    session: Session, target: uuid.UUID, *, actor: str, operator_id: uuid.UUID | None = None
) -> tuple[Operator, str]:
    """The operator's password stops working and their sessions end; returns a one-time
    link's token for them to set a new one."""
    op = _get(session, target, lock=True)
    token = _one_time_link(op)
    session.execute(delete(ConsoleSession).where(ConsoleSession.operator_id == op.id))
    _record(session, actor, operator_id, "operator.reset_password", op)
    return op, token


def operator_for_link(session: Session, token: str) -> Operator | None:
    """The enabled operator whose one-time link this is (None when unknown or expired)."""
    if not token or len(token) > 128:
        return None
    op = session.scalars(
        select(Operator).where(Operator.invite_token_hash == _token_hash(token))
    ).one_or_none()
    now = datetime.now(UTC)
    if op is None or op.disabled_at is not None or (op.invite_expires_at or now) <= now:
        return None
    return op


def set_password_with_link(session: Session, token: str, password: str) -> Operator:
    """Use a one-time link: set the password, spend the link."""
    op = operator_for_link(session, token)
    if op is None:
        raise NotFound("this link is unknown, used or expired; ask an owner for a new one",
                       code="link_not_found")  # fmt: skip
    op.password_hash = _HASHER.hash(check_password(password))
    op.invite_token_hash = op.invite_expires_at = None
    _record(session, operator_actor(op.email), op.id, "operator.set_password", op)
    return op
