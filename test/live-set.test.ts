/**
 * LiveSet keeps what a Set would (src/live-set.ts says why it is not one): checked against a Map as
 * the model over random sequences of adds, removals and re-adds, and for what a removal leaves.
 */
import fc from 'fast-check';
import t from 'tap';
import { LiveSet } from '../src/live-set.js';

class Item {
  liveSlot = -1;
  constructor(readonly name: number) {}
}

t.test('adds, removals and re-adds agree with a Map', async (t) => {
  const step = fc.oneof(fc.record({ op: fc.constant('add' as const), item: fc.nat(15), companion: fc.string() }), fc.record({ op: fc.constant('delete' as const), item: fc.nat(15) }));
  fc.assert(
    fc.property(fc.array(step, { maxLength: 200 }), (steps) => {
      const items = Array.from({ length: 16 }, (_, i) => new Item(i));
      const set = new LiveSet<Item, string>();
      const model = new Map<Item, string>();
      for (const s of steps) {
        const item = items[s.item]!;
        if (s.op === 'add') {
          set.add(item, s.companion);
          model.set(item, s.companion);
        } else if (set.delete(item) !== model.delete(item)) return false;
        if (set.size !== model.size) return false;
      }
      const entries = new Map(set.entries());
      if (entries.size !== model.size || [...model].some(([item, c]) => entries.get(item) !== c)) return false;
      // Every item knows its slot, and one not in the set says so.
      return items.every((item) => (model.has(item) ? set.values()[item.liveSlot] === item : item.liveSlot === -1));
    }),
  );
});

t.test('a removal forgets the item; the copies it hands out do not change with the set', async (t) => {
  const set = new LiveSet<Item>();
  const [a, b, c] = [new Item(1), new Item(2), new Item(3)];
  for (const item of [a, b, c]) set.add(item);
  const before = set.values();
  t.equal(set.delete(a), true);
  t.equal(set.delete(a), false, 'a second removal finds nothing');
  t.same(before.map((i) => i.name), [1, 2, 3], 'a copy taken before is unchanged');
  t.same(set.values().map((i) => i.name).sort(), [2, 3]);
  t.equal(a.liveSlot, -1);
  t.equal(set.find((i) => i.name === 3), c);
  t.equal(set.find((i) => i.name === 1), undefined);
  // Walking a copy while removing everything in it is safe.
  for (const item of set.values()) set.delete(item);
  t.equal(set.size, 0);
});

t.test('an item is in one LiveSet at a time', async (t) => {
  const one = new LiveSet<Item>();
  const other = new LiveSet<Item>();
  const item = new Item(1);
  one.add(item);
  t.throws(() => other.add(item), /another LiveSet/);
  t.equal(other.delete(item), false, 'the other set does not remove what it does not hold');
  t.equal(one.size, 1);
});
