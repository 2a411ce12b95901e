/**
 * The objects a long-lived owner holds while they are in use (exchanges in flight, streams being
 * written), entered and removed thousands of times a second, each with a companion value.
 *
 * Not a Map or a Set, because of how V8 keeps those: when it rehashes one (which steady churn does
 * every few dozen entries), the old table keeps its entries and a link to the new table, for
 * iterators still walking it. Once one such table has lived through two scavenges it sits in the
 * old generation, and the scavenger takes whatever an old object points to as live until the next
 * mark-compact: that table keeps every later table alive, and each of those the objects that were
 * in it when it was replaced. On the default path that was nearly every exchange: about 40% of what
 * the serving thread allocated survived its scavenge and was promoted, scavenges took 30–50 ms
 * instead of 1–2, and V8's helper threads spent some 40 µs per exchange ("Pauses" in
 * docs/architecture.md). Here an item is a slot in an array, and a removed slot is cleared, so
 * nothing removed stays reachable from anything the set still holds.
 *
 * The item keeps its own slot (`liveSlot`, -1 when in no set), so an item is in one LiveSet at a time.
 */
export interface LiveItem {
  liveSlot: number;
}

export class LiveSet<T extends LiveItem, C = undefined> {
  private readonly items: T[] = [];
  private readonly companions: C[] = [];

  get size(): number {
    return this.items.length;
  }

  /** Enters the item, or gives it a new companion if it is in already. */
  add(item: T, companion?: C): void {
    if (item.liveSlot >= 0) {
      if (this.items[item.liveSlot] !== item) throw new Error('the item is in another LiveSet');
      this.companions[item.liveSlot] = companion as C;
      return;
    }
    item.liveSlot = this.items.length;
    this.items.push(item);
    this.companions.push(companion as C);
  }

  /** Removes the item (the last one takes its slot); false when it was not in this set. */
  delete(item: T): boolean {
    const slot = item.liveSlot;
    if (slot < 0 || this.items[slot] !== item) return false;
    const last = this.items.pop()!;
    const lastCompanion = this.companions.pop()!;
    if (last !== item) {
      this.items[slot] = last;
      this.companions[slot] = lastCompanion;
      last.liveSlot = slot;
    }
    item.liveSlot = -1;
    return true;
  }

  /** The items now, with their companions, as a copy: the set may change while the caller walks it. */
  entries(): [T, C][] {
    return this.items.map((item, i) => [item, this.companions[i]!]);
  }

  /** The first item that passes `test` (a walk over every item: for what is rare, like a lookup without the item). */
  find(test: (item: T) => boolean): T | undefined {
    return this.items.find(test);
  }

  /** The items now, as a copy. */
  values(): T[] {
    return this.items.slice();
  }
}
