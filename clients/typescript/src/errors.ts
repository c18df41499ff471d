/** The errors of the Palisade client, by what the caller can do. */

/** Every error of this client; `code` is the gRPC status name. */
export class PalisadeError extends Error {
  constructor(message: string, readonly code: string = "UNKNOWN") {
    super(message);
    this.name = new.target.name;
  }
}
/** Bad input (lock name, TTL, wait, holder): fix the call; retrying will not help. */
export class InvalidArgument extends PalisadeError {}
/** The lock is held and the wait ran out: try later, or wait longer. */
export class LockHeld extends PalisadeError {}
/** The lease is gone (expired, released, or never existed): stop working under it. */
export class LeaseLost extends PalisadeError {}
/** The coordinator cannot be reached or is not ready: retry. */
export class Unavailable extends PalisadeError {}
/** No or wrong credentials. */
export class Unauthenticated extends PalisadeError {}
/** The credentials may not do this. */
export class PermissionDenied extends PalisadeError {}
/** The coordinator's lock policy refuses this acquire (e.g. a critical lock as efficiency). */
export class RefusedByPolicy extends PalisadeError {}
