/**
 * A typed key into an exchange's state bag (`ex.get(key)`, `ex.set(key, value)`). A leaf module:
 * the contracts, the exchange, the limiter and plugins all make keys, and none of them need import
 * another for it.
 */

/** A typed slot in an exchange's per-plugin state bag. */
export class StateKey<T> {
  constructor(readonly description: string) {}
  declare readonly _type: T;
}
