// Counts in words, for what people read: "1 tile", "2 tiles", "0 tiles" (as appliance/words.py).

export function counted(count, noun) {
  return `${count} ${count === 1 ? noun : `${noun}s`}`;
}
