//! Sandboxed arithmetic evaluator behind the `calculator` tool.
//!
//! The builtin calculator handler passes the model-supplied expression string
//! to [`evaluate`] and renders the result with [`format_number`]; any
//! [`CalcError`] is reported back to the model as a plain sentence so it can
//! correct its input.
//!
//! # What it accepts
//!
//! * numbers: `3`, `2.5`, `.5`, `5.`, `1e3`, `2.5E-4`
//! * binary operators `+ - * / %` and `^` (power); `×` is accepted for `*`,
//!   `÷` for `/`, `−` (U+2212) for `-` and `**` for `^`
//! * unary `-` and `+`
//! * parentheses and the functions `sqrt(x)`, `abs(x)`, `round(x)`,
//!   `round(x, digits)`, `min(a, b, ...)` and `max(a, b, ...)` (function names
//!   are case-insensitive)
//!
//! Precedence from loosest to tightest: `+ -`, then `* / %`, then unary
//! `- +`, then `^`. Power is right-associative and binds tighter than a unary
//! minus on its left, so `-2^2 = -4` and `2^3^2 = 512`; a sign is allowed in an
//! exponent (`2^-1 = 0.5`). `%` is the floating-point remainder, taking the
//! sign of the dividend (`-7 % 3 = -1`). All arithmetic is `f64`: `7/2 = 3.5`.
//!
//! There are no variables, assignments, strings or any other way to reach code
//! execution: the only names the parser knows are the five functions above.
//!
//! # Why hand-written
//!
//! `evalexpr` does integer division when both operands are integers
//! (`7/2 = 3`), accepts assignments, strings and chained statements, and
//! recurses without a bound so deeply nested input overflows the stack;
//! `meval` and `fasteval` are unmaintained. The grammar here is small enough
//! that a tokenizer plus a precedence-climbing parser is easier to audit than
//! a dependency.
//!
//! # Limits
//!
//! * Input longer than [`MAX_INPUT_LEN`] characters is refused before it is
//!   tokenized.
//! * Parentheses, unary operators and function calls may nest at most
//!   [`MAX_DEPTH`] levels. The counter is checked *before* each recursive
//!   descent, so the parser never recurses deeper than that and hostile input
//!   such as thousands of `(` yields [`CalcError::TooDeep`] instead of a stack
//!   overflow. Operator chains (`1+1+1...`, `2^2^2...`) are parsed iteratively.
//! * The parser emits reverse Polish notation that is evaluated with an
//!   explicit stack, so evaluation does not recurse either.
//! * Every intermediate result must be finite: division or remainder by zero
//!   gives [`CalcError::DivisionByZero`], overflow and undefined results (square
//!   root of a negative number, negative base with a fractional exponent) give
//!   [`CalcError::NotFinite`].

/// Maximum accepted expression length, in characters.
pub const MAX_INPUT_LEN: usize = 1_000;

/// Maximum nesting of parentheses, unary operators and function calls.
pub const MAX_DEPTH: usize = 64;

/// Largest `|digits|` accepted by `round(x, digits)`.
const MAX_ROUND_DIGITS: i32 = 15;

/// Names listed in error messages so the caller knows what is available.
const FUNCTION_LIST: &str = "sqrt, abs, round, min, max";

/// Why an expression could not be evaluated.
///
/// Positions (`pos`) are 1-based character positions in the original input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CalcError {
    /// The input is empty or whitespace only.
    #[error("the expression is empty")]
    Empty,
    /// The input is longer than [`MAX_INPUT_LEN`] characters.
    #[error("the expression is {len} characters long; the limit is {max} characters")]
    TooLong { len: usize, max: usize },
    /// Parentheses, unary operators or function calls nest deeper than [`MAX_DEPTH`].
    #[error("expression nests deeper than {max} levels")]
    TooDeep { max: usize },
    /// A character that is not part of the grammar.
    #[error(
        "unexpected character '{ch}' at position {pos}; only numbers, + - * / % ^, \
         parentheses, commas and the functions {FUNCTION_LIST} are allowed"
    )]
    UnexpectedChar { ch: char, pos: usize },
    /// A valid token in a place where it does not fit.
    #[error("unexpected '{found}' at position {pos}; expected {expected}")]
    UnexpectedToken {
        found: String,
        pos: usize,
        expected: &'static str,
    },
    /// The input ended in the middle of an expression.
    #[error("the expression ended too early; expected {expected}")]
    UnexpectedEnd { expected: &'static str },
    /// A call to a function that does not exist.
    #[error("unknown function '{name}'; available functions are {FUNCTION_LIST}")]
    UnknownFunction { name: String },
    /// A bare name: variables and constants are not supported.
    #[error(
        "unknown name '{name}'; variables and constants are not supported, only numbers \
         and the functions {FUNCTION_LIST}"
    )]
    UnknownName { name: String },
    /// A function called with the wrong number of arguments.
    #[error("{name}() takes {expected} but was given {got}")]
    WrongArity {
        name: String,
        expected: String,
        got: usize,
    },
    /// A function argument outside the function's domain (other than sqrt of a negative).
    #[error("invalid argument to {name}(): {reason}")]
    InvalidArgument { name: String, reason: &'static str },
    /// Division or remainder by zero (including `0 ^ negative`).
    #[error("division by zero")]
    DivisionByZero,
    /// A result that is infinite or not a number.
    #[error("the result is not a finite number: {reason}")]
    NotFinite { reason: &'static str },
    /// A malformed number literal such as `1.2.3` or `.`.
    #[error("'{text}' is not a valid number")]
    InvalidNumber { text: String },
}

const OVERFLOW: &str = "overflow (the value is too large)";

/// Evaluates an arithmetic expression.
///
/// The length limit is checked first, then the input is tokenized, parsed
/// (syntax and arity errors are reported before any arithmetic happens) and
/// evaluated.
pub fn evaluate(expr: &str) -> Result<f64, CalcError> {
    let len = expr.chars().count();
    if len > MAX_INPUT_LEN {
        return Err(CalcError::TooLong {
            len,
            max: MAX_INPUT_LEN,
        });
    }
    evaluate_unchecked_len(expr)
}

/// Everything [`evaluate`] does except the length check (tests use it to prove
/// that the depth limit alone protects the stack).
fn evaluate_unchecked_len(expr: &str) -> Result<f64, CalcError> {
    if expr.trim().is_empty() {
        return Err(CalcError::Empty);
    }
    let tokens = tokenize(expr)?;
    let program = Parser::new(tokens).parse()?;
    run(&program)
}

/// Formats a result for display: integers without a decimal point (`42`,
/// `-3`), other values with at most 10 decimal places and trailing zeros
/// trimmed (`3.5`, `0.3333333333`). Magnitudes of `1e21` and above, or
/// non-zero magnitudes below `1e-10`, use scientific notation (`1.5e-12`).
pub fn format_number(x: f64) -> String {
    if !x.is_finite() {
        return x.to_string();
    }
    if x == 0.0 {
        return "0".to_owned();
    }
    let abs = x.abs();
    if !(1e-10..1e21).contains(&abs) {
        let s = format!("{x:.9e}");
        let (mantissa, exponent) = s.split_once('e').unwrap_or((s.as_str(), "0"));
        return format!("{}e{exponent}", trim_fraction(mantissa));
    }
    if x.fract() == 0.0 {
        return format!("{x}");
    }
    let s = format!("{x:.10}");
    let trimmed = trim_fraction(&s);
    if trimmed == "-0" {
        "0".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// Removes trailing zeros after a decimal point, and the point if nothing is left.
fn trim_fraction(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

// ---------------------------------------------------------------------------
// Tokenizer
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq)]
enum TokenKind {
    Number(f64),
    Ident,
    Plus,
    Minus,
    Star,
    Slash,
    Percent,
    Caret,
    LParen,
    RParen,
    Comma,
}

#[derive(Debug, Clone)]
struct Token {
    kind: TokenKind,
    /// Source text of the token (identifier name, number literal, operator).
    text: String,
    /// 1-based character position of the token's first character.
    pos: usize,
}

fn tokenize(expr: &str) -> Result<Vec<Token>, CalcError> {
    let chars: Vec<char> = expr.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let pos = i + 1;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if c.is_ascii_digit() || c == '.' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            // Optional exponent, only when digits actually follow the `e`.
            if i < chars.len() && matches!(chars[i], 'e' | 'E') {
                let mut j = i + 1;
                if j < chars.len() && matches!(chars[j], '+' | '-') {
                    j += 1;
                }
                if j < chars.len() && chars[j].is_ascii_digit() {
                    while j < chars.len() && chars[j].is_ascii_digit() {
                        j += 1;
                    }
                    i = j;
                }
            }
            let text: String = chars[start..i].iter().collect();
            let value = parse_number(&text)?;
            tokens.push(Token {
                kind: TokenKind::Number(value),
                text,
                pos,
            });
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push(Token {
                kind: TokenKind::Ident,
                text: chars[start..i].iter().collect(),
                pos,
            });
            continue;
        }
        let (kind, width) = match c {
            '+' => (TokenKind::Plus, 1),
            '-' | '\u{2212}' => (TokenKind::Minus, 1),
            '*' if chars.get(i + 1) == Some(&'*') => (TokenKind::Caret, 2),
            '*' | '×' => (TokenKind::Star, 1),
            '/' | '÷' => (TokenKind::Slash, 1),
            '%' => (TokenKind::Percent, 1),
            '^' => (TokenKind::Caret, 1),
            '(' => (TokenKind::LParen, 1),
            ')' => (TokenKind::RParen, 1),
            ',' => (TokenKind::Comma, 1),
            _ => return Err(CalcError::UnexpectedChar { ch: c, pos }),
        };
        tokens.push(Token {
            kind,
            text: chars[i..i + width].iter().collect(),
            pos,
        });
        i += width;
    }
    Ok(tokens)
}

fn parse_number(text: &str) -> Result<f64, CalcError> {
    let mantissa = text.split(['e', 'E']).next().unwrap_or(text);
    if mantissa.matches('.').count() > 1 || !mantissa.chars().any(|c| c.is_ascii_digit()) {
        return Err(CalcError::InvalidNumber {
            text: text.to_owned(),
        });
    }
    let value: f64 = text.parse().map_err(|_| CalcError::InvalidNumber {
        text: text.to_owned(),
    })?;
    if value.is_finite() {
        Ok(value)
    } else {
        Err(CalcError::NotFinite {
            reason: "a number in the expression is too large",
        })
    }
}

// ---------------------------------------------------------------------------
// Parser: tokens -> reverse Polish notation
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Func {
    Sqrt,
    Abs,
    Round,
    Min,
    Max,
}

impl Func {
    fn lookup(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "sqrt" => Some(Self::Sqrt),
            "abs" => Some(Self::Abs),
            "round" => Some(Self::Round),
            "min" => Some(Self::Min),
            "max" => Some(Self::Max),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Sqrt => "sqrt",
            Self::Abs => "abs",
            Self::Round => "round",
            Self::Min => "min",
            Self::Max => "max",
        }
    }

    /// Checks the argument count; the error names the accepted counts.
    fn check_arity(self, got: usize) -> Result<(), CalcError> {
        let (ok, expected) = match self {
            Self::Sqrt | Self::Abs => (got == 1, "exactly 1 argument"),
            Self::Round => ((1..=2).contains(&got), "1 or 2 arguments"),
            Self::Min | Self::Max => (got >= 1, "at least 1 argument"),
        };
        if ok {
            Ok(())
        } else {
            Err(CalcError::WrongArity {
                name: self.name().to_owned(),
                expected: expected.to_owned(),
                got,
            })
        }
    }

    fn apply(self, args: &[f64]) -> Result<f64, CalcError> {
        let x = args.first().copied().unwrap_or(f64::NAN);
        let value = match self {
            Self::Sqrt => {
                if x < 0.0 {
                    return Err(CalcError::NotFinite {
                        reason: "square root of a negative number",
                    });
                }
                x.sqrt()
            }
            Self::Abs => x.abs(),
            Self::Round => match args.get(1) {
                None => x.round(),
                Some(&digits) => round_to(x, round_digits(digits)?),
            },
            Self::Min => args.iter().copied().fold(f64::INFINITY, f64::min),
            Self::Max => args.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        };
        finite(value, OVERFLOW)
    }
}

fn round_digits(digits: f64) -> Result<i32, CalcError> {
    let limit = f64::from(MAX_ROUND_DIGITS);
    if digits.fract() != 0.0 || digits.abs() > limit {
        return Err(CalcError::InvalidArgument {
            name: "round".to_owned(),
            reason: "the number of digits must be a whole number between -15 and 15",
        });
    }
    // In range and integral, so the cast is exact.
    Ok(digits as i32)
}

/// Rounds half away from zero to `digits` decimal places (negative `digits`
/// rounds to tens, hundreds, ...).
fn round_to(x: f64, digits: i32) -> f64 {
    if digits >= 0 {
        // Beyond 2^52 every f64 is already an integer.
        if x.abs() >= 4_503_599_627_370_496.0 {
            return x;
        }
        let factor = 10f64.powi(digits);
        (x * factor).round() / factor
    } else {
        let factor = 10f64.powi(-digits);
        (x / factor).round() * factor
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Num(f64),
    Neg,
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Pow,
    Call(Func, usize),
}

const EXPECT_OPERAND: &str = "a number, '(' or a function call";
const EXPECT_OPERATOR: &str = "an operator or the end of the expression";

struct Parser {
    tokens: Vec<Token>,
    idx: usize,
    depth: usize,
    out: Vec<Op>,
}

impl Parser {
    fn new(tokens: Vec<Token>) -> Self {
        Self {
            tokens,
            idx: 0,
            depth: 0,
            out: Vec::new(),
        }
    }

    fn parse(mut self) -> Result<Vec<Op>, CalcError> {
        if self.tokens.is_empty() {
            return Err(CalcError::Empty);
        }
        self.parse_expr()?;
        if let Some(tok) = self.tokens.get(self.idx) {
            return Err(unexpected(tok, EXPECT_OPERATOR));
        }
        Ok(self.out)
    }

    fn peek_kind(&self) -> Option<TokenKind> {
        self.tokens.get(self.idx).map(|t| t.kind)
    }

    /// Increments the nesting depth, refusing to go past [`MAX_DEPTH`].
    fn enter(&mut self) -> Result<(), CalcError> {
        if self.depth >= MAX_DEPTH {
            return Err(CalcError::TooDeep { max: MAX_DEPTH });
        }
        self.depth += 1;
        Ok(())
    }

    /// expr := term (('+' | '-') term)*
    fn parse_expr(&mut self) -> Result<(), CalcError> {
        self.parse_term()?;
        loop {
            let op = match self.peek_kind() {
                Some(TokenKind::Plus) => Op::Add,
                Some(TokenKind::Minus) => Op::Sub,
                _ => return Ok(()),
            };
            self.idx += 1;
            self.parse_term()?;
            self.out.push(op);
        }
    }

    /// term := unary (('*' | '/' | '%') unary)*
    fn parse_term(&mut self) -> Result<(), CalcError> {
        self.parse_unary()?;
        loop {
            let op = match self.peek_kind() {
                Some(TokenKind::Star) => Op::Mul,
                Some(TokenKind::Slash) => Op::Div,
                Some(TokenKind::Percent) => Op::Rem,
                _ => return Ok(()),
            };
            self.idx += 1;
            self.parse_unary()?;
            self.out.push(op);
        }
    }

    /// Consumes a run of unary signs, counting each one as a nesting level.
    /// Returns whether the run negates and how many levels were entered.
    fn parse_signs(&mut self) -> Result<(bool, usize), CalcError> {
        let mut negate = false;
        let mut count = 0;
        loop {
            match self.peek_kind() {
                Some(TokenKind::Minus) => negate = !negate,
                Some(TokenKind::Plus) => {}
                _ => return Ok((negate, count)),
            }
            self.enter()?;
            self.idx += 1;
            count += 1;
        }
    }

    /// unary := ('-' | '+')* power
    fn parse_unary(&mut self) -> Result<(), CalcError> {
        let (negate, levels) = self.parse_signs()?;
        self.parse_power()?;
        if negate {
            self.out.push(Op::Neg);
        }
        self.depth -= levels;
        Ok(())
    }

    /// power := primary ('^' ('-' | '+')* primary)*, right-associative.
    ///
    /// Parsed iteratively: all operands are emitted left to right, then the
    /// `Pow`s (and the negations of signed exponents) are emitted right to
    /// left, so `a ^ -b ^ c` becomes `a b c Pow Neg Pow` = `a ^ (-(b ^ c))`.
    fn parse_power(&mut self) -> Result<(), CalcError> {
        self.parse_primary()?;
        let mut exponent_signs = Vec::new();
        while self.peek_kind() == Some(TokenKind::Caret) {
            self.idx += 1;
            let (negate, levels) = self.parse_signs()?;
            self.parse_primary()?;
            self.depth -= levels;
            exponent_signs.push(negate);
        }
        for negate in exponent_signs.into_iter().rev() {
            if negate {
                self.out.push(Op::Neg);
            }
            self.out.push(Op::Pow);
        }
        Ok(())
    }

    /// primary := number | '(' expr ')' | name '(' [expr (',' expr)*] ')'
    fn parse_primary(&mut self) -> Result<(), CalcError> {
        let Some(tok) = self.tokens.get(self.idx) else {
            return Err(CalcError::UnexpectedEnd {
                expected: EXPECT_OPERAND,
            });
        };
        match tok.kind {
            TokenKind::Number(value) => {
                self.idx += 1;
                self.out.push(Op::Num(value));
                Ok(())
            }
            TokenKind::LParen => {
                self.enter()?;
                self.idx += 1;
                self.parse_expr()?;
                self.expect_rparen()?;
                self.depth -= 1;
                Ok(())
            }
            TokenKind::Ident => {
                let func = Func::lookup(&tok.text);
                let is_call = matches!(
                    self.tokens.get(self.idx + 1).map(|t| t.kind),
                    Some(TokenKind::LParen)
                );
                match (func, is_call) {
                    (Some(func), true) => self.parse_call(func),
                    (None, true) => Err(CalcError::UnknownFunction {
                        name: tok.text.clone(),
                    }),
                    (Some(_), false) => {
                        let expected = "'(' after the function name";
                        Err(match self.tokens.get(self.idx + 1) {
                            Some(next) => unexpected(next, expected),
                            None => CalcError::UnexpectedEnd { expected },
                        })
                    }
                    (None, false) => Err(CalcError::UnknownName {
                        name: tok.text.clone(),
                    }),
                }
            }
            _ => Err(unexpected(tok, EXPECT_OPERAND)),
        }
    }

    /// Parses `name(args...)`; the current token is the function name.
    fn parse_call(&mut self, func: Func) -> Result<(), CalcError> {
        self.enter()?;
        self.idx += 2; // name and '('
        let mut argc = 0;
        if self.peek_kind() == Some(TokenKind::RParen) {
            self.idx += 1;
        } else {
            loop {
                self.parse_expr()?;
                argc += 1;
                match self.tokens.get(self.idx) {
                    Some(t) if t.kind == TokenKind::Comma => self.idx += 1,
                    Some(t) if t.kind == TokenKind::RParen => {
                        self.idx += 1;
                        break;
                    }
                    Some(t) => return Err(unexpected(t, "',' or ')'")),
                    None => {
                        return Err(CalcError::UnexpectedEnd {
                            expected: "',' or ')'",
                        });
                    }
                }
            }
        }
        func.check_arity(argc)?;
        self.out.push(Op::Call(func, argc));
        self.depth -= 1;
        Ok(())
    }

    fn expect_rparen(&mut self) -> Result<(), CalcError> {
        match self.tokens.get(self.idx) {
            Some(t) if t.kind == TokenKind::RParen => {
                self.idx += 1;
                Ok(())
            }
            Some(t) => Err(unexpected(t, "an operator or ')'")),
            None => Err(CalcError::UnexpectedEnd { expected: "')'" }),
        }
    }
}

fn unexpected(tok: &Token, expected: &'static str) -> CalcError {
    CalcError::UnexpectedToken {
        found: tok.text.clone(),
        pos: tok.pos,
        expected,
    }
}

// ---------------------------------------------------------------------------
// Evaluation of the RPN program (iterative, explicit stack)
// ---------------------------------------------------------------------------

fn finite(value: f64, reason: &'static str) -> Result<f64, CalcError> {
    if value.is_finite() {
        Ok(value)
    } else {
        Err(CalcError::NotFinite { reason })
    }
}

fn run(program: &[Op]) -> Result<f64, CalcError> {
    // The parser only emits well-formed programs; a malformed one would be a
    // bug here, reported as a generic syntax error rather than a panic.
    let malformed = || CalcError::UnexpectedEnd {
        expected: EXPECT_OPERAND,
    };
    let mut stack: Vec<f64> = Vec::with_capacity(16);
    for &op in program {
        let value = match op {
            Op::Num(v) => v,
            Op::Neg => -stack.pop().ok_or_else(malformed)?,
            Op::Call(func, argc) => {
                let start = stack.len().checked_sub(argc).ok_or_else(malformed)?;
                let value = func.apply(&stack[start..])?;
                stack.truncate(start);
                value
            }
            Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Rem | Op::Pow => {
                let b = stack.pop().ok_or_else(malformed)?;
                let a = stack.pop().ok_or_else(malformed)?;
                binary(op, a, b)?
            }
        };
        stack.push(value);
    }
    match (stack.pop(), stack.is_empty()) {
        (Some(value), true) => Ok(value),
        _ => Err(malformed()),
    }
}

fn binary(op: Op, a: f64, b: f64) -> Result<f64, CalcError> {
    let value = match op {
        Op::Add => a + b,
        Op::Sub => a - b,
        Op::Mul => a * b,
        Op::Div | Op::Rem if b == 0.0 => return Err(CalcError::DivisionByZero),
        Op::Div => a / b,
        Op::Rem => a % b,
        Op::Pow if a == 0.0 && b < 0.0 => return Err(CalcError::DivisionByZero),
        Op::Pow => {
            let value = a.powf(b);
            if value.is_nan() {
                return Err(CalcError::NotFinite {
                    reason: "a negative number raised to a fractional power has no real value",
                });
            }
            value
        }
        Op::Num(_) | Op::Neg | Op::Call(..) => unreachable!("not a binary operator"),
    };
    finite(value, OVERFLOW)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(expr: &str) -> f64 {
        match evaluate(expr) {
            Ok(v) => v,
            Err(e) => panic!("{expr:?} failed: {e}"),
        }
    }

    fn err(expr: &str) -> CalcError {
        match evaluate(expr) {
            Ok(v) => panic!("{expr:?} unexpectedly evaluated to {v}"),
            Err(e) => e,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn basic_arithmetic() {
        assert_eq!(ok("6*7"), 42.0);
        assert_eq!(ok("7/2"), 3.5);
        assert_eq!(ok("10 % 3"), 1.0);
        assert_eq!(ok("-7 % 3"), -1.0);
        assert_eq!(ok("1 - 2 - 3"), -4.0);
        assert_eq!(ok("100 / 10 / 5"), 2.0);
        assert_eq!(ok("  42  "), 42.0);
    }

    #[test]
    fn precedence_and_parentheses() {
        assert_eq!(ok("2+3*4"), 14.0);
        assert_eq!(ok("(2+3)*4"), 20.0);
        assert_eq!(ok("2*3+4"), 10.0);
        assert_eq!(ok("10 - 4 / 2"), 8.0);
        assert_eq!(ok("2 * 3 ^ 2"), 18.0);
        assert_eq!(ok("((1 + 2) * (3 + 4))"), 21.0);
        assert_eq!(ok("1 + 2 % 2"), 1.0);
    }

    #[test]
    fn power_is_right_associative_and_binds_tighter_than_unary_minus() {
        assert_eq!(ok("2^3^2"), 512.0);
        assert_eq!(ok("(2^3)^2"), 64.0);
        assert_eq!(ok("-2^2"), -4.0);
        assert_eq!(ok("(-2)^2"), 4.0);
        assert_eq!(ok("2^-1"), 0.5);
        assert_eq!(ok("2^-1^2"), 0.5); // 2^(-(1^2))
        assert_eq!(ok("2**10"), 1024.0);
        assert_eq!(ok("2**3**2"), 512.0);
        assert_eq!(ok("0^0"), 1.0);
    }

    #[test]
    fn unary_operators() {
        assert_eq!(ok("-3"), -3.0);
        assert_eq!(ok("--3"), 3.0);
        assert_eq!(ok("+3"), 3.0);
        assert_eq!(ok("-+-3"), 3.0);
        assert_eq!(ok("2 * -3"), -6.0);
        assert_eq!(ok("2 - -3"), 5.0);
        assert_eq!(ok("-(2 + 3)"), -5.0);
    }

    #[test]
    fn decimals_and_exponents() {
        assert_eq!(ok("2.5 * 2"), 5.0);
        assert_eq!(ok(".5 + .25"), 0.75);
        assert_eq!(ok("5."), 5.0);
        assert_eq!(ok("1e3"), 1000.0);
        assert_eq!(ok("2.5E-1"), 0.25);
        assert_eq!(ok("1e+2"), 100.0);
        assert!(close(ok("0.1 + 0.2"), 0.3));
    }

    #[test]
    fn convenience_operators() {
        assert_eq!(ok("6 × 7"), 42.0);
        assert_eq!(ok("7 ÷ 2"), 3.5);
        assert_eq!(ok("5 \u{2212} 2"), 3.0);
    }

    #[test]
    fn functions() {
        assert_eq!(ok("sqrt(16)"), 4.0);
        assert_eq!(ok("SQRT(2) ^ 2").round(), 2.0);
        assert_eq!(ok("abs(-3.5)"), 3.5);
        assert_eq!(ok("Abs(4)"), 4.0);
        assert_eq!(ok("round(2.5)"), 3.0);
        assert_eq!(ok("round(-2.5)"), -3.0);
        assert_eq!(ok("round(2.4)"), 2.0);
        assert_eq!(ok("round(2.71828, 2)"), 2.72);
        assert_eq!(ok("round(1.23456, 3)"), 1.235);
        assert_eq!(ok("round(2/3, 4)"), 0.6667);
        assert_eq!(ok("round(1234.5, 0)"), 1235.0);
        assert_eq!(ok("round(1234, -2)"), 1200.0);
        assert_eq!(ok("min(3, 1, 2)"), 1.0);
        assert_eq!(ok("max(3, 1, 2)"), 3.0);
        assert_eq!(ok("MAX(-1)"), -1.0);
        assert_eq!(ok("min(5)"), 5.0);
        assert_eq!(ok("max(1, min(4, 2) * 3, sqrt(25))"), 6.0);
        assert_eq!(ok("-sqrt(4)^2"), -4.0);
    }

    #[test]
    fn function_arity() {
        let arity = |expr: &str, name: &str, got: usize| match err(expr) {
            CalcError::WrongArity {
                name: n, got: g, ..
            } => {
                assert_eq!((n.as_str(), g), (name, got), "{expr}");
            }
            other => panic!("{expr}: expected WrongArity, got {other:?}"),
        };
        arity("min()", "min", 0);
        arity("max()", "max", 0);
        arity("sqrt()", "sqrt", 0);
        arity("sqrt(1, 2)", "sqrt", 2);
        arity("abs(1, 2)", "abs", 2);
        arity("round(1, 2, 3)", "round", 3);
        assert_eq!(
            err("max()").to_string(),
            "max() takes at least 1 argument but was given 0"
        );
        assert!(matches!(
            err("round(1.5, 0.5)"),
            CalcError::InvalidArgument { .. }
        ));
        assert!(matches!(
            err("round(1.5, 99)"),
            CalcError::InvalidArgument { .. }
        ));
    }

    #[test]
    fn division_by_zero() {
        assert_eq!(err("1/0"), CalcError::DivisionByZero);
        assert_eq!(err("5 % 0"), CalcError::DivisionByZero);
        assert_eq!(err("1 / (2 - 2)"), CalcError::DivisionByZero);
        assert_eq!(err("0 ^ -1"), CalcError::DivisionByZero);
        assert_eq!(err("1/0").to_string(), "division by zero");
    }

    #[test]
    fn non_finite_results() {
        assert!(matches!(err("sqrt(-1)"), CalcError::NotFinite { .. }));
        assert!(matches!(err("(-8)^(1/3)"), CalcError::NotFinite { .. }));
        assert!(matches!(err("10^400"), CalcError::NotFinite { .. }));
        assert!(matches!(err("1e308 * 10"), CalcError::NotFinite { .. }));
        assert!(matches!(err("1e999"), CalcError::NotFinite { .. }));
        assert!(
            err("sqrt(-1)")
                .to_string()
                .contains("square root of a negative")
        );
    }

    #[test]
    fn deep_nesting_is_refused_without_overflowing_the_stack() {
        let nested = |n: usize| format!("{}5{}", "(".repeat(n), ")".repeat(n));
        assert_eq!(ok(&nested(MAX_DEPTH)), 5.0);
        assert_eq!(
            err(&nested(MAX_DEPTH + 1)),
            CalcError::TooDeep { max: MAX_DEPTH }
        );
        // Fits in MAX_INPUT_LEN, far deeper than MAX_DEPTH.
        assert_eq!(err(&nested(400)), CalcError::TooDeep { max: MAX_DEPTH });
        // Only opening parentheses.
        assert_eq!(err(&"(".repeat(900)), CalcError::TooDeep { max: MAX_DEPTH });
        // 5000 levels: through `evaluate` the length limit fires first; without
        // the length limit the depth limit alone must still stop it.
        let deep = nested(5000);
        assert!(matches!(err(&deep), CalcError::TooLong { .. }));
        assert_eq!(
            evaluate_unchecked_len(&deep),
            Err(CalcError::TooDeep { max: MAX_DEPTH })
        );
        assert_eq!(
            evaluate_unchecked_len(&"-".repeat(5000)),
            Err(CalcError::TooDeep { max: MAX_DEPTH })
        );
        assert_eq!(
            evaluate_unchecked_len(&"sqrt(".repeat(5000)),
            Err(CalcError::TooDeep { max: MAX_DEPTH })
        );
        assert_eq!(
            err(&"-".repeat(MAX_DEPTH + 1)),
            CalcError::TooDeep { max: MAX_DEPTH }
        );
        assert_eq!(
            err(&nested(MAX_DEPTH + 1)).to_string(),
            "expression nests deeper than 64 levels"
        );
    }

    #[test]
    fn long_operator_chains_are_fine() {
        // Chains are parsed iteratively and do not count as nesting.
        let sum = vec!["1"; 400].join("+");
        assert_eq!(ok(&sum), 400.0);
        let power = vec!["1"; 400].join("^");
        assert_eq!(ok(&power), 1.0);
    }

    #[test]
    fn input_length_limit() {
        let long = "1".repeat(100_000);
        assert_eq!(
            err(&long),
            CalcError::TooLong {
                len: 100_000,
                max: MAX_INPUT_LEN
            }
        );
        let at_limit = format!("1{}", "+1".repeat((MAX_INPUT_LEN - 1) / 2));
        assert!(at_limit.chars().count() <= MAX_INPUT_LEN);
        assert_eq!(ok(&at_limit), 500.0);
        // Counted in characters, not bytes.
        let wide = format!("2{}", "×1".repeat(499));
        assert_eq!(wide.chars().count(), 999);
        assert_eq!(ok(&wide), 2.0);
    }

    #[test]
    fn syntax_errors() {
        assert!(matches!(
            err("2 +* 3"),
            CalcError::UnexpectedToken { ref found, pos: 4, .. } if found == "*"
        ));
        assert!(matches!(
            err("2 3"),
            CalcError::UnexpectedToken { ref found, pos: 3, .. } if found == "3"
        ));
        assert!(matches!(err("2 +"), CalcError::UnexpectedEnd { .. }));
        assert!(matches!(err("(2 + 3"), CalcError::UnexpectedEnd { .. }));
        assert!(matches!(err("2 + 3)"), CalcError::UnexpectedToken { .. }));
        assert!(matches!(err("()"), CalcError::UnexpectedToken { .. }));
        assert!(matches!(err("2(3)"), CalcError::UnexpectedToken { .. }));
        assert!(matches!(err("max(1,)"), CalcError::UnexpectedToken { .. }));
        assert!(matches!(err("max(1 2)"), CalcError::UnexpectedToken { .. }));
        assert!(matches!(err("sqrt 4"), CalcError::UnexpectedToken { .. }));
        assert!(matches!(err("sqrt"), CalcError::UnexpectedEnd { .. }));
        assert!(matches!(err("1.2.3"), CalcError::InvalidNumber { .. }));
        assert!(matches!(err("."), CalcError::InvalidNumber { .. }));
        assert_eq!(
            err("2 3").to_string(),
            "unexpected '3' at position 3; expected an operator or the end of the expression"
        );
    }

    #[test]
    fn hostile_input_is_rejected() {
        assert_eq!(
            err("rm -rf /"),
            CalcError::UnknownName {
                name: "rm".to_owned()
            }
        );
        assert_eq!(
            err("exec(1)"),
            CalcError::UnknownFunction {
                name: "exec".to_owned()
            }
        );
        assert!(matches!(err("x + 1"), CalcError::UnknownName { .. }));
        assert!(matches!(
            err("x = 5"),
            CalcError::UnexpectedChar { ch: '=', .. }
        ));
        assert!(matches!(
            err("1; 2"),
            CalcError::UnexpectedChar { ch: ';', pos: 2 }
        ));
        assert!(matches!(err("\"1\" + 1"), CalcError::UnexpectedChar { .. }));
        assert!(matches!(err("2 = 2"), CalcError::UnexpectedChar { .. }));
        assert!(matches!(err("2 √ 4"), CalcError::UnexpectedChar { .. }));
        assert!(
            err("exec(1)")
                .to_string()
                .contains("sqrt, abs, round, min, max")
        );
    }

    #[test]
    fn empty_input() {
        assert_eq!(err(""), CalcError::Empty);
        assert_eq!(err("   \t\n"), CalcError::Empty);
        assert_eq!(err("").to_string(), "the expression is empty");
    }

    #[test]
    fn formatting() {
        assert_eq!(format_number(42.0), "42");
        assert_eq!(format_number(-3.0), "-3");
        assert_eq!(format_number(0.0), "0");
        assert_eq!(format_number(-0.0), "0");
        assert_eq!(format_number(3.5), "3.5");
        assert_eq!(format_number(1.0 / 3.0), "0.3333333333");
        assert_eq!(format_number(-2.0 / 3.0), "-0.6666666667");
        assert_eq!(format_number(0.1 + 0.2), "0.3");
        assert_eq!(format_number(1e15), "1000000000000000");
        assert_eq!(format_number(1.5e-12), "1.5e-12");
        assert_eq!(format_number(1e300), "1e300");
        assert_eq!(format_number(ok("7/2")), "3.5");
        assert_eq!(format_number(ok("(2+3)*4")), "20");
    }
}
