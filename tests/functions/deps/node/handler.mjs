import isNumber from 'is-number';

export async function handle(ctx, data) {
  return `is-number(${data}) = ${isNumber(String(data))}`;
}
