/** The one error type the core raises for bad input: an export it cannot read, bad options, a bad prompt. */
export class EdgespecError extends Error {
  override name = "EdgespecError";
}
